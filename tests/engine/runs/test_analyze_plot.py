"""The certified-accuracy figure keeps its title inside the picture (the demo's title included)."""

import pytest

from diffsmooth.engine.runs.analyze import curve_figure


def _rows(path, radii):
    lines = ["idx\tlabel\tpredict\tradius\tcorrect\ttime"]
    lines += [f"{i}\t0\t0\t{r}\t1\t0:00:01.0" for i, r in enumerate(radii)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("title", ["sigma=0.5, n=500, 30 images",
                                   "sigma=0.25, n=100000, 500 images, diffsmooth m=21 sigma'=0.25 and more words"])
def test_title_fits_the_figure(tmp_path, title):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    files = [_rows(tmp_path / "rs.tsv", [0.1, 0.5, 0.9]), _rows(tmp_path / "diffsmooth.tsv", [0.2, 0.7, 1.2])]
    fig = curve_figure(files, ["rs", "diffsmooth"], title)
    fig.canvas.draw()
    box = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
    plt.close(fig)
    inside = fig.bbox
    assert box.x0 >= inside.x0 and box.x1 <= inside.x1, (box, inside)
    assert box.y0 >= inside.y0 and box.y1 <= inside.y1, (box, inside)
