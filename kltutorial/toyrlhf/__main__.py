"""``python -m kltutorial.toyrlhf``: the β sweep of book section 11 (:func:`kltutorial.toyrlhf.cli.main`)."""

import torch

from .cli import main

if __name__ == "__main__":
    # This process runs only the sweep, whose tensors are tiny: one thread is several times faster than
    # many on a shared machine. Set here, for this process, never by the library for its importers.
    torch.set_num_threads(1)
    main()
