import numpy as np
import pytest

from hybrid_retrieval.search.normalize import THEORETICAL_MIN, dbsf, minmax, normalize, tmm, zscore

S = np.array([2.0, 4.0, 8.0])


def test_minmax():
    np.testing.assert_allclose(minmax(S), [0.0, (4 - 2) / (8 - 2), 1.0])


def test_zscore():
    mean, std = 14 / 3, np.sqrt(((2 - 14 / 3) ** 2 + (4 - 14 / 3) ** 2 + (8 - 14 / 3) ** 2) / 3)
    np.testing.assert_allclose(zscore(S), (S - mean) / std)


def test_theoretical_min_max_uses_the_scorer_floor():
    np.testing.assert_allclose(normalize(S, "tmm", THEORETICAL_MIN["bm25"]), [2 / 8, 4 / 8, 1.0])
    cosines = np.array([0.2, 0.6])
    np.testing.assert_allclose(normalize(cosines, "tmm", THEORETICAL_MIN["dense"]), [(0.2 + 1) / (0.6 + 1), 1.0])


def test_dbsf():
    mean, std = S.mean(), S.std()
    np.testing.assert_allclose(dbsf(S), (S - (mean - 3 * std)) / (6 * std))


@pytest.mark.parametrize("fn, constant", [(minmax, 1.0), (zscore, 0.0), (dbsf, 0.5)])
def test_degenerate_lists_map_to_a_constant(fn, constant):
    np.testing.assert_array_equal(fn(np.array([3.0])), [constant])
    np.testing.assert_array_equal(fn(np.array([5.0, 5.0, 5.0])), [constant] * 3)
    assert np.full(3, 0.1).std() > 0  # rounding noise, not a spread
    np.testing.assert_array_equal(fn(np.full(3, 0.1)), [constant] * 3)
    assert len(fn(np.array([]))) == 0


@pytest.mark.parametrize("fn, constant", [(minmax, 1.0), (zscore, 0.0), (dbsf, 0.5)])
def test_float_noise_is_no_spread(fn, constant):
    # three copies of one document: cosines that differ in the last float32 bits (as the service measured them)
    copies = np.array([0.61234567, 0.61234561, 0.61234567], dtype=np.float32).astype(np.float64)
    np.testing.assert_array_equal(fn(copies), [constant] * 3)
    # a real spread among them still counts, and near-copies stay near each other
    mixed = np.array([0.61234567, 0.61234561, 0.2, 0.4])
    scaled = fn(mixed)
    assert abs(scaled[0] - scaled[1]) < 1e-5 and scaled[0] > scaled[3] > scaled[2]


def test_tmm_degenerate_and_unknown_method():
    np.testing.assert_array_equal(tmm(np.array([0.0, 0.0]), floor=0.0), [1.0, 1.0])
    with pytest.raises(ValueError, match="valid: minmax, zscore, tmm, dbsf, none"):
        normalize(S, "softmax", 0.0)
