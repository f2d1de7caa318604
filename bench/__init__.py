"""sparkgate's benchmarks: what sparkgate costs, measured against its floors (docs/performance.md).

    python -m bench                 # all four; writes bench/results/<name>.json and prints a table
    python -m bench.admission       # one of them (admission, scale, refill, value); --smoke for a tiny run

Benchmarks are not tests: nothing here asserts a timing. tests/bench/ runs each one at its smoke size so the
scripts cannot rot.
"""
