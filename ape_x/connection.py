"""Ape-X's Ray (apex.py): a local Ray on this machine, or a cluster joined at an address that a
probe checked first, since ray.init retries for minutes at one that is not Ray.
"""

from __future__ import annotations

import argparse
import logging
import math
import socket
import threading
import time
from pathlib import Path

import grpc
import ray

ROOT = Path(__file__).resolve().parent.parent  # the repository, which every worker imports
# A cluster's workers get the repository through Ray's working_dir upload, without these.
UPLOAD_EXCLUDES = [".git", "models", "plots", "runs", "__pycache__", ".pytest_cache"]
LOCAL_START_ATTEMPTS = 3  # tries to start the local Ray
LOOPBACK = ("localhost", "127.0.0.1", "::1")
# check_reachable's request to a Ray GCS (a read of no key) and to a Ray client server (the
# PING its clients send first), as (method, serialized request); and answers Ray never gives
RAY_PROBES = {"gcs": ("/ray.rpc.InternalKVGcsService/InternalKVGet", b""),
              "client": ("/ray.rpc.RayletDriver/ClusterInfo", b"\x08\x06")}
NOT_RAY_ANSWERS = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.DEADLINE_EXCEEDED,
                   grpc.StatusCode.UNAVAILABLE)


def check_reachable(address: str, timeout: float) -> None:
    """ValueError unless a Ray cluster answers at `address` ("host:port", "ray://host:port")
    within `timeout` seconds. "auto" is left to Ray, which fails at once without a cluster.

    ray.init itself retries for minutes at an address that listens but is not Ray (an HTTP
    server, a socket that accepts and says nothing), so the probe (`ray_answer`) asks what Ray
    would: a TCP connection, a gRPC handshake and a request that Ray serves, where ray.init will
    look (for a loopback GCS address, at this machine's network address). It runs in a thread
    that the deadline abandons, so a name lookup that hangs is bounded too."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address must be auto, host:port or ray://host:port, got {address!r}")
    client = address.startswith("ray://")
    where = ""
    if host in LOOPBACK and not client:  # ray.init looks for it at this machine's own address
        host = ray.util.get_node_ip_address()
        where = f" ({host}:{port}, where Ray looks for it)"
    answers: list[str] = []
    probe = threading.Thread(target=lambda: answers.append(ray_answer(
        host, int(port), timeout, client)), daemon=True)
    probe.start()
    probe.join(timeout + 0.5)  # its own steps end by the deadline; a name lookup may not
    reason = answers[0] if answers else "no answer: the name lookup did not finish"
    if reason:
        raise ValueError(f"cannot reach the Ray cluster at {address}{where} within {timeout:g} "
                         f"s ({reason})")


def ray_answer(host: str, port: int, timeout: float, client: bool = False) -> str:
    """"" if `host:port` answers as a Ray GCS (or with `client`, a Ray client server) within
    `timeout` seconds, else why not: the TCP error, no gRPC handshake, or a gRPC server that
    lacks Ray's services. An answer to the request of RAY_PROBES other than NOT_RAY_ANSWERS is
    Ray's (a cluster with token authentication answers UNAUTHENTICATED)."""
    deadline = time.monotonic() + timeout
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=max(deadline - time.monotonic(), 0))
        method, request = RAY_PROBES["client" if client else "gcs"]
        channel.unary_unary(method)(request, timeout=max(deadline - time.monotonic(), 0))
    except grpc.FutureTimeoutError:
        return "it accepts connections but does not answer as Ray does: no gRPC handshake"
    except grpc.RpcError as error:
        if error.code() in NOT_RAY_ANSWERS:
            return f"it speaks gRPC, but not as Ray does: {error.code().name}"
    finally:
        channel.close()
    return ""


def connect_ray(config: argparse.Namespace, address: str | None) -> None:
    """Start a local Ray (address None) or join the cluster at `address`.

    Every worker runs TensorFlow on one thread (many actors share the cores) and imports this
    repository's modules: from this directory on a local Ray, from Ray's upload of it
    (working_dir, without models/, plots/, .git) on a cluster. Raises ValueError if joining fails.
    """
    env_vars = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2"}
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        # Logical CPUs: enough for every actor and the replay, even on fewer real cores.
        num_cpus = math.ceil(config.num_actors * config.actor_cpus) + 1
        # On a loaded machine Ray's own processes can miss their start-up deadline: try again.
        for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
            try:
                ray.init(num_cpus=num_cpus, object_store_memory=config.object_store_mb * 1024**2,
                         include_dashboard=False,
                         runtime_env={"env_vars": {**env_vars, "PYTHONPATH": str(ROOT)}}, **quiet)
                return
            except Exception as error:  # Ray raises several types for a start-up timeout
                ray.shutdown()
                if attempt == LOCAL_START_ATTEMPTS:
                    raise ValueError(f"cannot start a local Ray ({attempt} attempts): "
                                     f"{str(error).strip().splitlines()[-1]}") from error
    try:
        ray.init(address=address, runtime_env={"working_dir": str(ROOT),
                                               "excludes": UPLOAD_EXCLUDES,
                                               "env_vars": env_vars}, **quiet)
    except (ConnectionError, RuntimeError) as error:
        raise ValueError(f"cannot join the Ray cluster at {address}: "
                         f"{str(error).splitlines()[0]}") from error
