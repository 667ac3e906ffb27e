"""The alerts adapter sends only what SNS Publish accepts."""

from __future__ import annotations

from typing import Any

from gpufleet.adapters.aws.notifier import SUBJECT_MAX_CHARACTERS, SnsNotifier


class _Sns:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, **params: Any) -> None:
        self.published.append(params)


def test_a_long_subject_is_cut_below_the_limit_sns_allows() -> None:
    sns = _Sns()
    SnsNotifier(sns, "arn:aws:sns:us-east-1:123456789012:alerts").notify(
        "gpufleet: job " + "x" * 120 + " stopped for budget", "body"
    )
    subject = sns.published[0]["Subject"]
    # SNS wants fewer than 100 characters: a 100-character subject fails the whole call.
    assert len(subject) == SUBJECT_MAX_CHARACTERS < 100
    assert subject.startswith("gpufleet: job xxx")


def test_line_breaks_and_control_characters_never_reach_the_subject() -> None:
    sns = _Sns()
    SnsNotifier(sns, "arn:aws:sns:us-east-1:123456789012:alerts").notify(
        "job a\nb\x1b[31m red", "body"
    )
    assert sns.published[0]["Subject"] == "job a b [31m red"
