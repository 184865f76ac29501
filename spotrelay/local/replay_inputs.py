"""What a replay sends into the system, as AWS and its operator would (`ReplayInputs`, a part of
`spotrelay.local.replay.Replay`): the jobs' messages on the queue, the queue-depth alarm's state changes, the
safety-net schedule, the scenario's recorded events (acting on the simulated worker they are bound to),
TerminateInstances on the workers, the outages of the functions and the operator's recovery steps.

Its siblings: spotrelay.local.replay_state (the state it works on), spotrelay.local.replay_observe (what the
replay sees the system do), spotrelay.local.replay (the loop that runs them).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from spotrelay.aws import recovery
from spotrelay.config import EVENT_TARGET_DLQ_OUTPUT
from spotrelay.control.dispatcher import job_id_for
from spotrelay.local import patches
from spotrelay.local.lambdas import AsynchronousInvocations
from spotrelay.local.outages import AsynchronousDeliveries, FunctionOutages, dead_letters_to_sqs
from spotrelay.local.recorded import iso
from spotrelay.local.replay_report import OperatorReport
from spotrelay.local.replay_state import ReplayState, TrackedJob
from spotrelay.local.scenario import Injection, OperatorAction, OperatorStep, Submission
from spotrelay.local.workers import InstanceWorker

ALARM_PERIOD = timedelta(minutes=1)
_GONE = {"stopping", "stopped", "shutting-down", "terminated"}

EVENT_TARGETS = recovery.EVENT_TARGETS  # how the operator report names the rule targets' DLQ


class ReplayInputs(ReplayState):
    """What the replay sends into the system (a part of `spotrelay.local.replay.Replay`)."""

    # --- events ------------------------------------------------------------------------------------

    def _alarm_event(self, value: str) -> dict[str, Any]:
        event = copy.deepcopy(self._recorded["alarm"])
        stack = self.stack
        name = stack.depth_alarm_name
        now = self.clock.now()
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.000+0000")
        event["account"], event["region"], event["time"] = stack.account_id, stack.region, iso(now)
        event["resources"] = [f"arn:aws:cloudwatch:{stack.region}:{stack.account_id}:alarm:{name}"]
        detail = event["detail"]
        detail["alarmName"] = name
        for metric in detail["configuration"]["metrics"]:
            metric["metricStat"]["metric"]["dimensions"]["QueueName"] = stack.queue_url.rsplit("/", 1)[-1]
        detail["previousState"]["value"] = self._alarm
        detail["previousState"]["timestamp"] = detail["state"]["timestamp"]
        detail["state"]["value"] = value
        detail["state"]["timestamp"] = stamp
        return dict(event)

    def _evaluate_alarm(self) -> None:
        """The queue-depth alarm (>= 1 visible message over a minute): its state change, if any."""
        attributes = self.runtime.sqs.get_queue_attributes(
            QueueUrl=self.stack.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        depth = int(attributes.get("ApproximateNumberOfMessages", "0"))
        value = "ALARM" if depth >= 1 else "OK"
        if value != self._alarm:
            self._put(self._alarm_event(value))
            self._alarm = value

    def _tick(self) -> None:
        for rule in self.stack.schedule_rules:
            self.runtime.fire_schedule(rule)
        self._evaluate_alarm()
        self.schedule(self.clock.now() + timedelta(minutes=self.scenario.schedule_minutes), "schedule", self._tick)

    def _submit(self, batch: Sequence[Submission]) -> None:
        for submission in batch:
            message_id = self.runtime.sqs.send_message(QueueUrl=self.stack.queue_url, MessageBody=submission.body)[
                "MessageId"
            ]
            try:
                data = json.loads(submission.body)
            except json.JSONDecodeError:
                data = None
            name = data.get("name") if isinstance(data, dict) else None
            job_id = job_id_for(name if isinstance(name, str) and name else "invalid", message_id)
            tracked = TrackedJob(submission, job_id, message_id, self.clock.now())
            self.jobs[submission.name] = tracked
            self._by_id[job_id] = tracked
            self.note(submission.name, f"submitted ({job_id})")
        self.schedule(self.clock.now() + ALARM_PERIOD, "alarm", self._evaluate_alarm)

    def _inject(self, injection: Injection) -> None:
        event = copy.deepcopy(injection.event)
        worker: InstanceWorker | None = None
        if injection.job is not None:
            tracked = self.jobs.get(injection.job)
            worker = (
                self._workers_by_attempt.get((tracked.job_id, injection.attempt or 1)) if tracked is not None else None
            )
            if worker is None:
                self.note(
                    injection.job,
                    f"recorded event {injection.source} not injected: attempt {injection.attempt or 1} has no instance",
                )
                return
            event = self._bound(event, worker.instance_id)
        else:
            event["time"] = iso(self.clock.now())
        self._put(event)
        self._events_injected += 1
        kind = str(event.get("detail-type", ""))
        label = injection.job or "-"
        self.note(label, f"injected {kind} ({injection.source})")
        if worker is None:
            return
        detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
        assert isinstance(detail, dict)
        if kind == "EC2 Spot Instance Interruption Warning":
            worker.notice("injected")
        elif kind == "EC2 Instance Rebalance Recommendation":
            worker.rebalance()
        elif kind == "EC2 Instance State-change Notification" and detail.get("state") in _GONE:
            worker.lost()

    def _terminated(self, instance_ids: Sequence[str]) -> None:
        """TerminateInstances went through (the control plane's, or the replay's own at a notice's end)."""
        for instance_id in instance_ids:
            worker = self.workers.get(instance_id)
            if worker is not None:
                worker.terminated_by_control_plane()

    # --- outages and the operator ------------------------------------------------------------------

    def _attach_outages(self) -> None:
        """The scenario's outages of the functions and its operator steps (spotrelay.local.outages)."""
        scenario = self.scenario
        self._asynchronous: AsynchronousInvocations | None = None
        self._outages: FunctionOutages | None = None
        self._operator: list[OperatorReport] = []
        if not scenario.outages_of_functions and not scenario.operator:
            return
        installed = patches.installed()
        assert installed is not None
        roles = {name: module for module, name in self.stack.functions.items()}
        if self.chaos is not None:
            self._asynchronous = self.chaos.asynchronous()
        else:
            self._asynchronous = AsynchronousInvocations(self, label="lambda", who=lambda name: roles.get(name, name))
            installed.delivery_faults = AsynchronousDeliveries(self._asynchronous)
        functions = {q.name: q.queue_url for q in self._dead_letter_queues() if q.name != recovery.EVENT_TARGETS}
        self._asynchronous.dead_letter = dead_letters_to_sqs(self.runtime.sqs, functions)
        windows = [(scenario.at(o.start), scenario.at(o.end)) for o in scenario.outages_of_functions]
        self._outages = FunctionOutages(self.now, windows, otherwise=self.runtime.lambdas.faults)
        self.runtime.lambdas.faults = self._outages
        for start, end in windows:
            self.schedule(
                start, "outage", lambda: self.note("-", "control plane down: every function invocation fails")
            )
            self.schedule(end, "outage", lambda: self.note("-", "control plane back: the functions answer again"))
        for step in scenario.operator:
            self.schedule(scenario.at(step.at), "operator", lambda step=step: self._run_operator(step))  # type: ignore[misc]

    def _dead_letter_queues(self) -> list[recovery.DeadLetterQueue]:
        """The stack's DLQs, from its outputs (moto keeps no DeadLetterConfig), as `admin redrive` finds them."""
        outputs = self.stack.outputs
        return recovery.dead_letter_queues(outputs.__getitem__, outputs.get(EVENT_TARGET_DLQ_OUTPUT))

    def _run_operator(self, step: OperatorStep) -> None:
        """An operator step, calling what the CLI command calls (spotrelay.aws.recovery)."""
        sqs = self.runtime.sqs
        if step.run is OperatorAction.REDRIVE_DLQ:
            # What `spotrelay admin redrive` drains: each function's DLQ (Lambda's retries given up), then the
            # rule targets' (the events EventBridge could not deliver)
            lambda_ = self.runtime.client("lambda")
            for queue in self._dead_letter_queues():
                function, queue_url = queue.name, queue.queue_url
                before = recovery.queue_depth(sqs, queue_url)
                done = queue.redrive(sqs, lambda_)
                after = recovery.queue_depth(sqs, queue_url)
                detail = {"function": function, "depth_before": before, "found": done.found, "handled": done.handled}
                detail |= {"failed": done.failed, "depth_after": after}
                self._operator.append(OperatorReport(self.clock.now(), str(step.run), detail))
                self.note(
                    "operator",
                    f"spotrelay admin redrive: {done.handled} of {done.found} dead-lettered events of {function} "
                    f"handled, {done.failed} failed again; the DLQ holds {after} (held {before})",
                )
            return
        assert step.start is not None
        assert step.end is not None
        start, end = self.scenario.at(step.start), self.scenario.at(step.end)
        deliveries = len(self.runtime.deliveries)
        replayed = recovery.replay_archive(
            self.runtime.events, archive_name=recovery.archive_name(self.stack.outputs), start=start, end=end
        )
        made = self.runtime.deliveries[deliveries:]
        detail = {"name": replayed.name, "from": iso(start), "to": iso(end), "state": replayed.state}
        detail |= {"events": len({d.event_id for d in made}), "deliveries": len(made)}
        detail |= {"failed": sum(1 for d in made if d.error is not None)}
        self._operator.append(OperatorReport(self.clock.now(), str(step.run), detail))
        self.note(
            "operator",
            f"spotrelay admin replay-archive {iso(start)} to {iso(end)}: {detail['events']} archived events "
            f"delivered again ({detail['deliveries']} deliveries, {detail['failed']} failed)",
        )


__all__ = ["ALARM_PERIOD", "EVENT_TARGETS", "ReplayInputs"]
