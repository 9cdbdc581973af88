"""A rank's reply on the wire: large arrays out of band (pickle protocol 5), sent from the
tensor's memory and received into the buffer the owner's tensor then uses, with no copy between."""
import ctypes
import multiprocessing as mp
import pickle
import threading
import warnings

import torch

from mtb_helpers import run
from mtb_helpers.runtime.worker import OUT_OF_BAND_BYTES, _dumps, recv_reply, send_reply


def _big(n: int = OUT_OF_BAND_BYTES // 8 * 3) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64)


def test_large_arrays_leave_the_stream_small_ones_stay_in_it():
    stream, buffers = _dumps(("ok", 1, {"big": _big(), "small": torch.ones(10)}))
    assert len(buffers) == 1 and buffers[0].raw().nbytes == _big().numel() * 8
    assert len(stream) < 2000   # the 196 KB array is not in it
    stream, buffers = _dumps(("ok", 1, torch.ones(10)))
    assert buffers == [] and len(stream) > 80   # 80 bytes of values, in band


def test_a_reply_round_trips_and_the_owners_tensor_lives_in_the_received_buffer():
    ours, theirs = mp.Pipe()
    reply = ("ok", 7, {"big": _big(), "big_t": _big().view(3, -1).T, "small": torch.ones(3)})
    sender = threading.Thread(target=send_reply, args=(theirs, *_dumps(reply)))
    sender.start()   # the pipe holds less than the reply: the rank writes while the owner reads
    stream, buffers = recv_reply(ours)
    sender.join()
    assert len(buffers) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a read-only array would warn in torch.from_numpy
        kind, call_id, got = pickle.loads(stream, buffers=buffers)
    assert (kind, call_id) == ("ok", 7)
    for name, want in reply[2].items():
        assert torch.equal(got[name], want) and got[name].shape == want.shape, name
    start = ctypes.addressof((ctypes.c_char * len(buffers[0])).from_buffer(buffers[0]))
    assert got["big"].data_ptr() == start   # no copy after the receive
    got["big"][0] = -1.0                     # writable, as a tensor from a rank always was
    assert got["big"][0] == -1.0


def test_large_tensors_from_ranks_arrive_equal_with_their_dtype_and_layout():
    def make():
        base = torch.arange(3 * OUT_OF_BAND_BYTES // 8, dtype=torch.float64).view(3, -1)
        return {"c": base, "f": base.T, "f32": base.float(), "ints": base.long(), "small": base[:, :2]}

    [got] = run(make, world_size=1)
    for name, want in make().items():
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
