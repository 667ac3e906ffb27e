"""The end of a Capacity Block for ML as EC2 makes it, which moto does not model (it has no
capacity reservations: `ec2_rules` holds them).

EC2 User Guide, "Monitor Capacity Blocks using EventBridge": forty minutes before a block ends,
EC2 sends the "Capacity Block Reservation Expiration Warning" event (its detail the
reservation's id and end date), which says that the instances running in it "will begin to
terminate in 10 minutes"; thirty minutes before the end it terminates them, each with its
"EC2 Instance State-change Notification" events (`shutting-down`, then `terminated`).

`CapacityBlockEnds` does that for every block the account holds, on EC2's clock (the wall
clock's, as the blocks' dates are), looking every `every_seconds` of the account's clock.
EventBridge delivers EC2's events on a best-effort basis: the warnings of the blocks named in
`lost_warnings` never arrive, as one can be lost in AWS (the control plane's reconciler drains
such a block's runs on its own clock).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from gpufleet.emulator.account import ACCOUNT_ID, Account
from gpufleet.emulator.ec2_rules import ec2_now, put_ec2_event
from gpufleet.emulator.ticker import Ticker
from gpufleet.topology import DETAIL_BLOCK_EXPIRATION_WARNING, DETAIL_STATE_CHANGE

WARNING_BEFORE_END = timedelta(minutes=40)
TERMINATION_BEFORE_END = timedelta(minutes=30)


class CapacityBlockEnds(Ticker):
    """Warns of each Capacity Block's end, then terminates the instances in it, as EC2 does;
    `warned` and `terminated` are what it did."""

    def __init__(
        self,
        account: Account,
        now: Callable[[], datetime] = ec2_now,
        every_seconds: float = 1.0,
        lost_warnings: Collection[str] = (),
    ) -> None:
        super().__init__("capacity-block-ends", every_seconds, account.clock)
        self._account = account
        self._now = now
        self._lost_warnings = frozenset(lost_warnings)
        self.warned: list[str] = []  # reservation ids
        self.terminated: list[str] = []  # instance ids

    def tick(self) -> None:
        now = self._now()
        for reservation_id, end, instance_ids in self._account.ec2_rules.capacity_blocks():
            if now >= end - WARNING_BEFORE_END and reservation_id not in self.warned:
                self.warned.append(reservation_id)
                if reservation_id not in self._lost_warnings:
                    self._event(
                        DETAIL_BLOCK_EXPIRATION_WARNING,
                        {"capacity-reservation-id": reservation_id, "end-date": end.isoformat()},
                        f"capacity-reservation/{reservation_id}",
                    )
            if now >= end - TERMINATION_BEFORE_END:
                self._terminate(sorted(instance_ids - set(self.terminated)))

    def _terminate(self, instance_ids: list[str]) -> None:
        if not instance_ids:
            return
        ec2 = self._account.client("ec2")
        answer = ec2.terminate_instances(InstanceIds=instance_ids)
        self.terminated.extend(instance_ids)
        for change in answer["TerminatingInstances"]:
            if change["PreviousState"]["Name"] in ("shutting-down", "terminated"):
                continue  # ended already (released by the control plane): no news
            for state in ("shutting-down", "terminated"):
                self._event(
                    DETAIL_STATE_CHANGE,
                    {"instance-id": change["InstanceId"], "state": state},
                    f"instance/{change['InstanceId']}",
                )

    def _event(self, detail_type: str, detail: dict[str, str], resource: str) -> None:
        account = self._account
        arn = f"arn:aws:ec2:{account.region}:{ACCOUNT_ID}:{resource}"
        put_ec2_event(account.client("events"), detail_type, detail, arn)
