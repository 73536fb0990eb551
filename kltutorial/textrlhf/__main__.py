"""``python -m kltutorial.textrlhf``: pretrain the base model, or run the β sweep
(:func:`kltutorial.textrlhf.cli.main`)."""

import torch

from .cli import main

if __name__ == "__main__":
    # The runs are bit-identical on one machine with one thread, and the tensors are small: set here, for
    # this process, never by the library for its importers.
    torch.set_num_threads(1)
    main()
