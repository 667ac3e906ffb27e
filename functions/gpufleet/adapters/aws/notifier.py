"""Alerts for people, on the stack's SNS topic."""

from __future__ import annotations

from typing import Any


class SnsNotifier:
    def __init__(self, client: Any, topic_arn: str) -> None:
        self._client = client
        self._topic = topic_arn

    def notify(self, subject: str, message: str) -> None:
        if not self._topic:  # functions that alert nobody are not given a topic
            raise RuntimeError("no alerts topic is configured for this function")
        self._client.publish(TopicArn=self._topic, Subject=subject[:100], Message=message)
