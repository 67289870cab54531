import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import multiprocess_fns
from meshfeed.testing import run_in_processes


def _mesh():
    return meshfeed.make_mesh(data=4, model=2)


def test_1d_shows_one_box_per_block():
    text = meshfeed.show_sharding(NamedSharding(meshfeed.make_mesh(data=8), P("data")), shape=(16,))
    assert "shape [16]  P('data',) on mesh data=8" in text
    for k in range(8):
        assert f"[{2 * k}:{2 * k + 2}]" in text and f"d{k}" in text
    assert "replicated" not in text and "not split" not in text


def test_2d_shows_rows_and_columns():
    text = meshfeed.show_sharding(NamedSharding(_mesh(), P("data", "model")), shape=(256, 128))
    assert "dim 0 \\ dim 1" in text
    assert "[0:64]" in text and "[64:128]" in text and "[192:256]" in text
    row = next(line for line in text.splitlines() if line.startswith("│ [64:128]"))
    assert "d2" in row and "d3" in row


def test_3d_and_4d_grid_over_the_split_dimensions_and_name_the_others():
    three = meshfeed.show_sharding(
        NamedSharding(_mesh(), P("data", None, "model")), shape=(8, 3, 4)
    )
    assert "dim 0 \\ dim 2" in three and "not split: dim 1 (3)" in three
    four = meshfeed.show_sharding(
        NamedSharding(_mesh(), P(None, "data", None, "model")), shape=(2, 8, 3, 4)
    )
    assert "dim 1 \\ dim 3" in four and "not split: dim 0 (2), dim 2 (3)" in four
    mesh3 = meshfeed.make_mesh(a=2, b=2, c=2)
    cube = meshfeed.show_sharding(NamedSharding(mesh3, P("a", "b", "c")), shape=(4, 4, 4))
    assert "dim 0 \\ dims 1, 2" in cube and "[0:2]  [2:4]" in cube and "d7" in cube


def test_full_and_partial_replication_are_named():
    full = meshfeed.show_sharding(NamedSharding(_mesh(), P()), shape=(8, 3))
    assert "d0,1,2,3,4,5,6,7" in full
    assert "replicated over mesh axes ('data', 'model'): 8 copies of each block" in full
    partial = meshfeed.show_sharding(NamedSharding(_mesh(), P("data")), shape=(16,))
    assert "d0,1" in partial
    assert "replicated over mesh axes ('model',): 2 copies of each block" in partial


def test_an_array_shows_its_dtype_and_needs_no_shape():
    x = jax.device_put(np.zeros((16, 4), np.float32), NamedSharding(_mesh(), P(("data", "model"))))
    text = meshfeed.show_sharding(x)
    assert text.startswith("float32[16, 4]") and "[14:16]" in text


def test_processes_label_blocks_as_if_split():
    text = meshfeed.show_sharding(NamedSharding(_mesh(), P("data")), shape=(8,), processes=2)
    assert "p0" in text and "p1" in text and "2 processes" in text


@pytest.mark.multiprocess
def test_two_processes_print_the_same_text_with_process_ids():
    texts = run_in_processes(multiprocess_fns.layout_text)
    assert texts[0] == texts[1]
    assert "p0" in texts[0] and "p1" in texts[0] and "2 processes" in texts[0]


def test_bad_input():
    with pytest.raises(ValueError, match="pass shape= with a Sharding"):
        meshfeed.show_sharding(NamedSharding(_mesh(), P("data")))
    with pytest.raises(TypeError, match=r"expected a jax\.Array or a Sharding"):
        meshfeed.show_sharding(np.zeros(3))
    with pytest.raises(ValueError, match="processes=3 must divide the 8 devices"):
        meshfeed.show_sharding(NamedSharding(_mesh(), P("data")), shape=(8,), processes=3)


def test_plot_sharding_writes_a_png_of_the_expected_size(tmp_path):
    import matplotlib.image

    from meshfeed.inspect._plot import figure_size
    from meshfeed.inspect._show import grid

    sharding = NamedSharding(_mesh(), P("data", "model"))
    path = meshfeed.inspect.plot_sharding(
        sharding, tmp_path / "layout.png", shape=(256, 128), dpi=80
    )
    image = matplotlib.image.imread(path)
    width, height = figure_size(grid(sharding, shape=(256, 128)))
    assert image.shape[:2] == (round(height * 80), round(width * 80))
    assert image[..., :3].std() > 0.05  # not blank
    svg = meshfeed.inspect.plot_sharding(sharding, tmp_path / "layout.svg", shape=(256, 128))
    assert "<svg" in svg.read_text()
    with pytest.raises(ValueError, match=r"must end in \.png or \.svg"):
        meshfeed.inspect.plot_sharding(sharding, tmp_path / "layout.jpg", shape=(256, 128))


def test_plot_sharding_leaves_the_matplotlib_backend_alone(tmp_path):
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend plot_sharding would not pick itself
    try:
        sharding = NamedSharding(_mesh(), P("data"))
        meshfeed.inspect.plot_sharding(sharding, tmp_path / "layout.png", shape=(8,))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
