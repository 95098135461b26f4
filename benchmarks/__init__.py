"""The benchmark scripts, run as `python benchmarks/<name>.py`, and imported by the tests as
`from benchmarks import study`.

A script puts the repository's root first on Python's path, then imports its siblings from this
package (`from benchmarks import provenance`), so each is loaded once, under one name (a test that
patches `study` patches what `render_docs` calls).
"""
