"""The memory a Q-network with an MLP torso takes, estimated from its sizes before it is built:
a network that cannot fit is refused by its flag, not met as an allocation failure mid-build."""

from __future__ import annotations

import itertools

from d3qn_utils.replay_memory import machine_memory_bytes

FLOAT_BYTES = 4  # float32 weights and activations
# Each weight is held this often: the online and target networks, a gradient, two optimizer slots
# (Adam's moments) and the greedy policy's numpy copy (greedy_policy.py).
WEIGHT_COPIES = 6
# Each hidden unit's activation, per sample of a minibatch: the forward pass of the states and
# its gradient, and the next states through the online and the target networks.
ACTIVATIONS_PER_UNIT = 4


def mlp_parameters(features: int, hidden_units: tuple[int, ...], actions: int,
                   dueling: bool) -> int:
    """Weights and biases of `OurModel`'s MLP on `features` inputs: its dense layers, then one
    output per action (dueling: and one for the state's value)."""
    sizes = (features, *hidden_units, actions + (1 if dueling else 0))
    return sum((inputs + 1) * outputs for inputs, outputs in itertools.pairwise(sizes))


def check_mlp_fits(state_shape: tuple[int, ...], hidden_units: tuple[int, ...], actions: int,
                   dueling: bool, batch_size: int) -> None:
    """ValueError naming HIDDEN_UNITS (--hidden-units) if the networks it makes for vector states
    of `state_shape`, with their copies and a minibatch's activations, would need more than this
    machine's memory. Nothing for image states: their torso is the game's, not HIDDEN_UNITS'."""
    machine = machine_memory_bytes()
    if len(state_shape) != 1 or not machine:
        return
    parameters = mlp_parameters(state_shape[0], hidden_units, actions, dueling)
    needed = FLOAT_BYTES * (WEIGHT_COPIES * parameters
                            + ACTIVATIONS_PER_UNIT * batch_size * sum(hidden_units))
    if needed > machine:
        raise ValueError(
            f"HIDDEN_UNITS (--hidden-units) {hidden_units} needs about {needed / 2**30:,.1f} GiB "
            f"({parameters:,} parameters, each held {WEIGHT_COPIES} times: the two networks, a "
            f"gradient, the optimizer's slots, the greedy copy; and a minibatch of "
            f"{batch_size}'s activations), more than this machine's {machine / 2**30:,.1f} GiB")
