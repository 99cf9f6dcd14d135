"""Counter-based noise: Philox known-answer vectors, batch independence, Gaussian statistics."""

import pytest
import torch
from scipy import stats

from diffsmooth.engine.certify.noise import STREAM_LOCAL, STREAM_SMOOTHING, fixed_local_noise, gaussian, philox4x32


def _philox(counter, key):
    c = [torch.tensor([v], dtype=torch.int64) for v in counter]
    return [int(x) for x in philox4x32(*c, *key)]


def test_philox_known_answers():
    # Random123's published known-answer tests for Philox4x32-10
    assert _philox([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert _philox([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert _philox([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_noise_depends_only_on_sample_index():
    whole = gaussian(5, STREAM_SMOOTHING, 3, 0, 64, (1, 7, 5))
    parts = torch.cat([gaussian(5, STREAM_SMOOTHING, 3, s, 16, (1, 7, 5)) for s in range(0, 64, 16)])
    assert torch.equal(whole, parts)
    assert torch.equal(gaussian(5, STREAM_SMOOTHING, 3, 10, 1, (1, 7, 5))[0], whole[10])


def test_streams_images_and_seeds_differ():
    base = gaussian(1, STREAM_SMOOTHING, 0, 0, 4, (3, 4, 4))
    for other in (gaussian(2, STREAM_SMOOTHING, 0, 0, 4, (3, 4, 4)),
                  gaussian(1, STREAM_LOCAL, 0, 0, 4, (3, 4, 4)),
                  gaussian(1, STREAM_SMOOTHING, 1, 0, 4, (3, 4, 4))):
        assert not torch.allclose(base, other)


def test_gaussian_statistics():
    z = gaussian(123, STREAM_SMOOTHING, 9, 0, 200, (3, 16, 16)).flatten().double()
    assert z.dtype == torch.float64 and z.numel() == 200 * 768
    assert abs(z.mean().item()) < 0.01
    assert abs(z.std().item() - 1) < 0.01
    assert stats.kstest(z[:20000].numpy(), "norm").pvalue > 1e-4
    # neighbouring elements and neighbouring samples are uncorrelated
    zz = z.view(200, 768)
    assert abs(torch.corrcoef(torch.stack([zz[:, 0], zz[:, 1]]))[0, 1]) < 0.2
    assert abs(torch.corrcoef(torch.stack([zz[:-1].flatten(), zz[1:].flatten()]))[0, 1]) < 0.01


def test_fixed_local_noise_is_reproducible_torch_randn():
    a = fixed_local_noise(5, (3, 8, 8))
    g = torch.Generator().manual_seed(42)
    assert torch.equal(a, torch.randn((5, 3, 8, 8), generator=g))


@pytest.mark.parametrize("image,first,num", [(0, 2**32 - 2, 4), (0, 2**32, 1), (2**32, 0, 1), (-1, 0, 1),
                                             (0, -1, 2), (0, 0, -1)])
def test_indices_beyond_32_bits_are_refused(image, first, num):
    with pytest.raises(ValueError, match="32 bits"):
        gaussian(0, 0, image, first, num, (2,))


def test_last_32_bit_sample_index_is_allowed():
    assert gaussian(0, 0, 2**32 - 1, 2**32 - 2, 2, (2,)).shape == (2, 2)
