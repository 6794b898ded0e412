"""reel: the Python client of Reel, a diffusion-serving cluster.

    from reel import Client
    with Client("tcp://127.0.0.1:5555") as c:
        r = c.gen("tiny", context, steps=8, latent_shape=(4, 2, 8, 8), seed=1)
        r.latent, r.worker, r.version, r.replayed
        c.sync(2, path="/shared/w2.safetensors")

    # a broker started with --keys: this trainer's key and the broker's
    Client("tcp://broker:5555", key="keys/alice.key", broker_key="keys/broker.pub")

    # a standby pair: the active broker serves, the client moves on a takeover
    Client("tcp://a:5555,tcp://b:5555")

Pure Python on pyzmq, msgpack and numpy; torch tensors are accepted and
returned when any tensor argument is a torch tensor, and never required.
"""

from .client import (BusyError, Client, GenResult, ReelError, ReelTimeout, SyncFailed, SyncResult,
                     checkpoint_identity, read_key, sha256_file)
from . import safetensors

__all__ = ["Client", "GenResult", "SyncResult", "ReelError", "BusyError", "ReelTimeout", "SyncFailed",
           "sha256_file", "checkpoint_identity", "read_key", "safetensors"]
__version__ = "0.1.0"
