"""Notify: a job's status change, told to the topics its team names (domain/notify.py)."""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.domain.notify import StatusChange, TeamNotify, destinations, message
from gpufleet.ports import Notifier


class StatusNotifications:
    def __init__(
        self,
        notifier: Notifier,
        teams: Mapping[str, TeamNotify],
        team_topics: Mapping[str, str],
    ) -> None:
        self._notifier = notifier
        self._teams = teams
        self._team_topics = team_topics  # team -> the topic the deployment made for it

    def status_changed(self, change: StatusChange) -> tuple[str, ...]:
        """Publish the change to each of its destinations; the topics it went to."""
        topics = destinations(
            change.team, change.status, change.notify, self._teams, self._team_topics
        )
        subject, text = message(change)
        for topic in topics:
            self._notifier.publish(topic, subject, text)
        return topics
