"""Alerts for people, on the stack's SNS topic, and the teams' notifications on theirs."""

from __future__ import annotations

import re
from typing import Any

# SNS Publish: a Subject is UTF-8 text with no line breaks or control characters, and less
# than 100 characters long; anything else fails the whole call (InvalidParameter).
SUBJECT_MAX_CHARACTERS = 99
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def sns_subject(text: str) -> str:
    """`text` as a Subject SNS accepts: control characters become spaces, cut to the limit."""
    subject = _CONTROL.sub(" ", text).strip()
    if len(subject) > SUBJECT_MAX_CHARACTERS:
        subject = subject[: SUBJECT_MAX_CHARACTERS - 1] + "…"
    return subject or "gpufleet"


class SnsNotifier:
    def __init__(self, client: Any, topic_arn: str) -> None:
        self._client = client
        self._topic = topic_arn

    def notify(self, subject: str, message: str) -> None:
        if not self._topic:  # functions that alert nobody are not given a topic
            raise RuntimeError("no alerts topic is configured for this function")
        self.publish(self._topic, subject, message)

    def publish(self, topic_arn: str, subject: str, message: str) -> None:
        self._client.publish(TopicArn=topic_arn, Subject=sns_subject(subject), Message=message)
