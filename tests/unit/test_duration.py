from __future__ import annotations

from gpufleet.domain.duration import DEFAULT_SECONDS, PastRun, estimate_duration
from gpufleet.domain.spec import Resources, parse_spec

SPEC = parse_spec("name: a\nteam: t\nimage: img:1\ncommand: [x]\nresources: {gpus: 2}\n")
SAME = Resources(gpus=2)


def runs(*seconds: float, image: str = "img:1", resources: Resources = SAME) -> list[PastRun]:
    return [PastRun(image, resources, s) for s in seconds]


def test_the_spec_wins_when_it_says() -> None:
    spec = SPEC.model_copy(update={"expected_duration_seconds": 600})
    estimate = estimate_duration(spec, runs(10, 20, 30))
    assert (estimate.seconds, estimate.source) == (600, "spec")


def test_the_median_of_similar_runs_otherwise() -> None:
    estimate = estimate_duration(SPEC, runs(100, 200, 10_000, 300))
    assert (estimate.seconds, estimate.source, estimate.samples) == (250, "history", 4)
    assert "4 similar" in estimate.describe()


def test_other_images_and_shapes_do_not_count() -> None:
    history = runs(50, 50, 50, image="img:2") + runs(70, 70, 70, resources=Resources(gpus=8))
    assert estimate_duration(SPEC, history).source == "default"


def test_too_little_history_falls_back_to_the_default() -> None:
    estimate = estimate_duration(SPEC, runs(100, 200))
    assert (estimate.seconds, estimate.source) == (DEFAULT_SECONDS, "default")
