"""Write the shipped FedScale-format client behaviour trace sample (``algorithm_params.availability =
"fedscale:sample"``): ``pickle.dumps(availability.sample_table(), protocol=4)`` — 32 synthetic clients, seeded, not
measured devices (phalanx.training.algorithms.availability; tests/test_async_availability.py checks the file is
this function's output).

    PYTHONPATH=src python scripts/make_fedscale_availability_sample.py
"""

from __future__ import annotations

import pickle

from phalanx.training.algorithms import availability


def main() -> None:
    availability.SAMPLE.write_bytes(pickle.dumps(availability.sample_table(), protocol=4))
    print(f"wrote {availability.SAMPLE}")


if __name__ == "__main__":
    main()
