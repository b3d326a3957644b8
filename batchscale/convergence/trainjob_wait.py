"""Waiting for a TrainJob, every wait bounded: poll its status until a deadline, copy node-0's
log in a thread that is given up on after a drain time, and say what timed out and what to
check. The bounds come from WaitLimits, whose sum with the job's own activeDeadlineSeconds fits
inside the step pod's deadline (trainjob.py)."""

from __future__ import annotations

import datetime as dt
import math
import sys
import threading
import time
from dataclasses import dataclass

from batchscale.convergence.usererror import UserCodeError, user_error_in_log
from batchscale.deadline import DeadlinePassed, call_within
from batchscale.errors import BatchscaleError

COMPLETE, FAILED, RUNNING = "Complete", "Failed", "Running"
# kubeflow/trainer pkg/constants/constants.go TrainJobDeadlineExceededReason
DEADLINE_EXCEEDED = "DeadlineExceeded"
MAX_EVENTS = 10
NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)  # sorts events without a time first
WAITS_OUTSIDE_JOB = 6
"""Waits of at most `api_timeout_s` each that fall outside the job's deadline and Trainer's
grace, on the longest path (the job Failed just as the wait ends): the create (the deadline
counts from it), the status read in flight when the wait ends, the one more read that may
follow it (the next poll's first, or the "did not start" message's), the Failed condition, the
events, the delete."""


@dataclass(frozen=True)
class WaitLimits:
    """Bounds of the launcher's waits, seconds. The job's own deadline plus everything after it
    (`after_job_s`) fits inside the step pod's deadline (`job_deadline_s`)."""

    poll_interval_s: float = 5.0
    api_timeout_s: float = 30.0
    """One request of ours, or one status read of the SDK (read_job), waited for at most this."""
    trainer_grace_s: float = 60.0
    """After the job's deadline, for Trainer to mark it Failed before the launcher gives up."""
    log_drain_s: float = 15.0
    """After the job ends, for the rest of its log to arrive."""
    pod_reserve_s: float = 120.0
    """Kept of the pod's deadline for reading the tables and KFP's output upload."""

    @property
    def after_job_s(self) -> float:
        return (self.trainer_grace_s + self.log_drain_s +
                WAITS_OUTSIDE_JOB * self.api_timeout_s + self.pod_reserve_s)

    def room_s(self, pod_left_s: float | None) -> int | None:
        """Whole seconds a job may take so that `after_job_s` still fits before the step pod's
        deadline; None without one. BatchscaleError when there is no room at all."""
        if pod_left_s is None:
            return None
        fits = math.floor(pod_left_s - self.after_job_s)
        if fits < 1:
            raise BatchscaleError(
                f"the convergence step's pod has {pod_left_s:.0f} s left before its deadline, "
                f"less than the {self.after_job_s:.0f} s kept for ending a TrainJob and saving "
                "its tables; raise kubernetes.convergence_timeout_margin_s")
        return fits

    def job_deadline_s(self, timeout_s: float, pod_left_s: float | None) -> int:
        """The TrainJob's activeDeadlineSeconds: convergence.timeout_s, cut to the room the step
        pod's deadline leaves, so the job ends first."""
        wanted, fits = math.ceil(timeout_s), self.room_s(pod_left_s)
        if fits is None or fits >= wanted:
            return wanted
        warn(f"the TrainJob's deadline is {fits} s, not convergence.timeout_s ({wanted} s): "
             "the step's pod must outlive it (kubernetes.convergence_timeout_margin_s)")
        return fits


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def poll_status(client, name: str, wanted: set[str], until: float, limits: WaitLimits):
    """The job once its status is in `wanted`, or None at `until` (time.monotonic()). A failed
    read is retried until then: one lost request must not end a long training."""
    while True:
        try:
            job = read_job(client, name, limits.api_timeout_s)
        except (RuntimeError, TimeoutError) as err:
            if getattr(err.__cause__, "status", None) == 404:
                raise BatchscaleError(f"TrainJob {name} is gone: something else deleted it "
                                      "while the step was waiting for it") from None
            job = None
            cause = f": {err.__cause__}" if err.__cause__ else ""
            warn(f"could not read TrainJob {name} ({err}{cause}); retrying")
        if job is not None and job.status in wanted:
            return job
        left = until - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(limits.poll_interval_s, left))


def api_call(client, what: str, call, timeout_s: float):
    """`call()` (a request of the SDK or the kubernetes client), given at most `timeout_s` in
    all: their timeouts bound each read, not the request, so an API server that trickles its
    answer would hold the step until the pod's deadline. A call still going then is left to its
    daemon thread; TimeoutError names the API server and the bound."""
    try:
        return call_within(call, timeout_s, name=f"k8s-{what}")
    except DeadlinePassed:
        raise TimeoutError(f"the Kubernetes API at {api_host(client)} did not complete {what} "
                           f"within {timeout_s:g} s") from None


def api_host(client) -> str:
    try:
        return client.backend.core_api.api_client.configuration.host
    except AttributeError:
        return "(unknown host)"


def read_job(client, name: str, timeout_s: float):
    """client.get_job(name), waited for at most `timeout_s` (TimeoutError). The SDK waits up to
    120 s for each of its requests, and one read is up to four of them: the job, its runtime
    (namespaced, then cluster-wide) and its pods (kubeflow 0.5, KubernetesBackend.get_job), so
    8 minutes on a stalled API server, more than the pod's deadline keeps for it."""
    return api_call(client, f"reading TrainJob {name}", lambda: client.get_job(name), timeout_s)


class LogCopy:
    """node-0's log copied into the step's log by a daemon thread, as it is written. Reading a
    followed log blocks until the pod ends, so the thread is joined only for a drain time and
    then left behind (it dies with the process)."""

    def __init__(self, client, name: str):
        self.name = name
        self.user_error: str | None = None
        """The first user error (usererror.UserCodeError) node-0 printed, if any."""
        self.thread = threading.Thread(target=self._copy, args=(client,), daemon=True,
                                       name=f"log-{name}")
        self.thread.start()

    def _copy(self, client) -> None:
        try:
            for line in client.get_job_logs(self.name, follow=True):
                print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
                self.user_error = self.user_error or user_error_in_log(str(line))
        except Exception as err:  # noqa: BLE001 - the log is a courtesy; the status decides
            warn(f"the log of TrainJob {self.name} stopped: {err}")

    def finish(self, drain_s: float) -> None:
        self.thread.join(max(0.0, drain_s))
        if self.thread.is_alive():
            warn(f"the log of TrainJob {self.name} was still open {drain_s:.0f} s after the job "
                 "ended; not waiting for the rest")


def pod_phases(job) -> str:
    steps = [f"{s.name} {s.status or 'unknown'}" for s in (job.steps if job else [])]
    return ", ".join(steps) if steps else "no pods yet"


def job_events(client, name: str, timeout_s: float) -> str:
    """The warning events of the job and everything named after it (its JobSet, Jobs, pods),
    last MAX_EVENTS. Read from the namespace, not through the SDK, which keeps only the events
    of pods that still exist: after a deadline the JobSet and its pods are gone, and their
    FailedScheduling events are what explains the failure."""
    backend = client.backend
    try:
        events = api_call(client, "listing events", lambda: backend.core_api.list_namespaced_event(
            backend.namespace, _request_timeout=timeout_s), timeout_s).items
    except Exception as err:  # noqa: BLE001 - events only enrich the message
        return f" (events unavailable: {err})"
    ours = [e for e in events if e.type == "Warning" and e.involved_object and
            (e.involved_object.name == name or
             (e.involved_object.name or "").startswith(f"{name}-"))]
    ours.sort(key=lambda e: e.last_timestamp or e.first_timestamp or e.event_time or NEVER)
    lines = [f"{e.involved_object.kind}/{e.involved_object.name} {e.reason}: {e.message}"
             for e in ours[-MAX_EVENTS:]]
    return f" (events: {' | '.join(lines)})" if lines else ""


def failed_conditions(client, name: str, timeout_s: float) -> str:
    """The Failed condition's reason and message, read from the object itself."""
    from kubeflow.trainer.constants import constants

    backend = client.backend
    try:
        job = api_call(client, f"reading TrainJob {name}", lambda: (
            backend.custom_api.get_namespaced_custom_object(
                constants.GROUP, constants.VERSION, backend.namespace, constants.TRAINJOB_PLURAL,
                name, _request_timeout=timeout_s)), timeout_s)
    except Exception as err:  # noqa: BLE001 - the job failed either way
        return f"its Failed condition could not be read: {err}"
    conditions = [c for c in job.get("status", {}).get("conditions", [])
                  if c.get("type") == FAILED and c.get("status") == "True"]
    return "; ".join(f"{c.get('reason', '?')}: {c.get('message', '')}" for c in conditions) or \
        "no Failed condition recorded"


def placement_hint(image: str) -> str:
    return ("Pods that stay Pending are not placed or cannot pull their image: check "
            "kubernetes.node_selector and tolerations (with GPUs also gpu_node_selector and "
            "gpu_tolerations) against the nodes' labels and taints, free GPU capacity, a queue "
            f"(Kueue) holding the job, and that the image {image} exists and can be pulled "
            "(registry, tag, imagePullSecrets)")


def await_job(client, job, *, until: float, limits: WaitLimits) -> None:
    """Wait until the job runs, copy its log, wait until it ends; Failed, or still not done at
    `until`, raise BatchscaleError saying what timed out and what to check."""
    name = job.metadata.name
    started = time.monotonic()
    seen = poll_status(client, name, {RUNNING, COMPLETE, FAILED}, until, limits)
    if seen is None:
        raise BatchscaleError(
            f"TrainJob {name} did not start running within {time.monotonic() - started:.0f} s "
            f"({pod_phases(client_job(client, name, limits.api_timeout_s))}). "
            f"{placement_hint(job.spec.trainer.image)}"
            f"{job_events(client, name, limits.api_timeout_s)}")
    ran = seen.status in {RUNNING, COMPLETE}
    logs = LogCopy(client, name)
    if seen.status == RUNNING:
        seen = poll_status(client, name, {COMPLETE, FAILED}, until, limits)
    logs.finish(limits.log_drain_s)
    if seen is None:
        raise BatchscaleError(
            f"TrainJob {name} was still running {time.monotonic() - started:.0f} s after it "
            f"was created, past its activeDeadlineSeconds ({job.spec.active_deadline_seconds} s, "
            f"from convergence.timeout_s) and {limits.trainer_grace_s:.0f} s for Trainer to end "
            "it: check that the Trainer controller is running (kubeflow-system)")
    if seen.status == FAILED and logs.user_error:  # the workload's own code: bad input
        raise UserCodeError(f"TrainJob {name} failed on the workload's own code: "
                            f"{logs.user_error}")
    if seen.status == FAILED:
        reason = failed_conditions(client, name, limits.api_timeout_s)
        events = job_events(client, name, limits.api_timeout_s)
        raise BatchscaleError(f"TrainJob {name} failed: {reason}{events}"
                              f"{deadline_hint(reason, ran, job)}")


def deadline_hint(reason: str, ran: bool, job) -> str:
    """What a DeadlineExceeded failure means: never running is a placement or image problem,
    running too long is a setting."""
    if DEADLINE_EXCEEDED not in reason:
        return ""
    if not ran:
        return f". It never ran on all its nodes. {placement_hint(job.spec.trainer.image)}"
    return (f". Training ran past the job's activeDeadlineSeconds "
            f"({job.spec.active_deadline_seconds} s, from convergence.timeout_s): raise "
            "convergence.timeout_s (and kubernetes.convergence_timeout_margin_s) or lower "
            "convergence.max_steps")


def client_job(client, name: str, timeout_s: float):
    try:
        return read_job(client, name, timeout_s)
    except (RuntimeError, TimeoutError):
        return None
