"""``python -m benchmarks.gpu_features``: the short name of :mod:`benchmarks.capacity.gpu_features`."""

from benchmarks.capacity.gpu_features import main

if __name__ == "__main__":
    main()
