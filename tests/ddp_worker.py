"""Run under torchrun: train through the CLI, then dump this rank's weights."""

import os
import sys

from safetensors.torch import save_file

from iclprobe import training
from iclprobe.cli import main

out, dump = sys.argv[1], sys.argv[2]
trained = {}
original = training.train


def keep(model, *args, **kwargs):
    result = original(model, *args, **kwargs)
    trained["model"] = model
    return result


training.train = keep  # the CLI calls training.train; keep a handle on this rank's model
rc = main(["train", "--out", out, *sys.argv[3:]])
rank = int(os.environ["RANK"])
state = {k: v.contiguous() for k, v in trained["model"].state_dict().items()}
save_file(state, f"{dump}/rank{rank}.safetensors")
sys.exit(rc)
