"""FashionMNIST IDX files (raw or gzip) for the PyTorch twins of the apps (classify_torch.py,
classify_steps_torch.py, wgan_gp_torch.py), which import it from this folder. Needs only numpy."""
import gzip
import os
import struct
import sys

import numpy as np


def read_idx(root, name):
    """The array in <root>/<name> or <root>/<name>.gz; exits naming the file when neither exists."""
    for path in (os.path.join(root, name), os.path.join(root, name + ".gz")):
        if os.path.exists(path):
            with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
                data = f.read()
            ndim = data[3]
            dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
            return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    sys.exit(f"{os.path.basename(sys.argv[0])}: {os.path.join(root, name)}[.gz] not found")
