"""``python -m benchmarks.bench_duty_cycle``: the short name of :mod:`benchmarks.capacity.bench_duty_cycle`."""

from benchmarks.capacity.bench_duty_cycle import main

if __name__ == "__main__":
    main()
