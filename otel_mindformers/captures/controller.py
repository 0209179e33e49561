"""`CaptureController`: evidence taken when an alert rule fires, or when a person asks.

Kinds (`alert_config.capture.kinds`, docs/captures.md):
- `profile`: MindSpore's profiler for the next `profile_steps` steps on this rank, started
  and stepped at step boundaries on the training thread; the analysis runs in the
  profiler's own process (`analysis: async`) or later (`deferred`);
- `stacks`: every thread's stack, taken on the asking thread;
- `batch`: what identifies the step's data: step, epoch, step in epoch, dataset size, batch
  shapes and dtypes, and with `batch_crc32` a CRC-32 of the first input tensor (read on
  sampled steps only).

Threads: `on_alert` runs where the rule fired (the pipeline worker, the stall watchdog, or
the training thread for a custom monitor's alert); `on_sampled_step` (the on-demand
request's one stat) on the pipeline worker; `note_batch` on sampled steps and `on_step_end`
only while `active` on the training thread, which otherwise reads one attribute per step.
Rate limits: at most one capture in flight, `cooldown_steps` between rule-triggered ones,
`max_captures` of them per run; the rank's folder is kept under `max_bytes` by removing its
oldest captures. A failure is warned about once, and never reaches training.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import Span

from otel_mindformers.captures import store
from otel_mindformers.captures.profile_session import ProfilerUnavailable, ProfileSession, load_profiler
from otel_mindformers.compat import mindspore_model
from otel_mindformers.compat.lookup import ApiNotFound, feature_off
from otel_mindformers.config.schema import CaptureConfig
from otel_mindformers.core.clock import StepClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.hangs.stacks import capture as capture_stacks
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import capture_names as names
from otel_mindformers.names import semconv
from otel_mindformers.telemetry.training_instruments import create_instrument

_logger = get_logger(__name__)

STACK_TEXT_CHARS = 200_000
# How long a capture's finishing thread waits for the profiler's analysis to write the trace.
ANALYSIS_WAIT_SECONDS = 600.0
SIZE_CHECK_SECONDS = 1.0  # a profile's folder is measured at most this often (a walk of its files)
# Batch notes kept while the worker catches up: it drops those before the step it handles
# (a rule fires for the record in hand), so this bound only caps a worker that never comes
# back; records queued (1024) and in hand (64) are at most this many sampled steps behind.
_BATCH_NOTES = 1088


@dataclass
class _Profile:
    """A profile asked for and not finished: started at the next step boundary."""

    folder: Path
    manifest: dict[str, Any]
    steps: int
    session: ProfileSession | None = None
    boundaries: list[int] = field(default_factory=list)  # time.time_ns() at each step end
    first_step: int = 0
    # Set by the worker, honoured by the training thread at its next step end: the status
    # ("cancelled": a request; "stopped": the folder passed max_bytes) and why.
    stop: tuple[str, str] | None = None


class NoCaptures:
    """What a run holds when captures are off: the same calls, doing nothing."""

    active = False
    notes_batches = False

    def on_alert(self, rule: str, step: int, span: Span | None) -> str | None:
        return None

    def on_sampled_step(self, step: int, span: Span | None, ended_at: float) -> None:
        pass

    def note_batch(self, cb_params: Any, step: int) -> None:
        pass

    def on_step_end(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


NO_CAPTURES = NoCaptures()


class CaptureController:
    """Build with `CaptureController.start(...)` at train begin, on the training thread."""

    @classmethod
    def start(
        cls, config: CaptureConfig, identity: Identity, telemetry: Any, cb_params: Any, progress: StepClock
    ) -> CaptureController | NoCaptures:
        if not config.enabled:
            return NO_CAPTURES
        return cls(config, identity, telemetry, cb_params, progress)

    def __init__(
        self, config: CaptureConfig, identity: Identity, telemetry: Any, cb_params: Any, progress: StepClock
    ) -> None:
        self.active = False  # read by the training thread at a step end `progress.wake` marks
        self._progress = progress
        self._config = config
        self._identity = identity
        self._otel_logger = telemetry.logger
        self._counter = create_instrument(telemetry.meter, names.CAPTURES)
        self._point_attributes = identity.point_attributes()
        self._lock = threading.Lock()
        self._training_ident = threading.get_ident()
        self._root = Path(config.path).absolute()  # notifications are read elsewhere
        self._rank_root = store.rank_folder(self._root, identity.rank)
        self._all_rules = names.ALL_RULES in config.rules
        self._rules = frozenset(config.rules)
        self._kinds = list(config.kinds)
        self._taken = 0
        self._last_triggered_step: int | None = None
        self._profile: _Profile | None = None
        self._warned: set[str] = set()
        self._finishers: list[threading.Thread] = []
        self._dataset = _dataset_meta(cb_params)
        self._batch_notes: dict[int, dict[str, Any]] = {}
        self.notes_batches = names.KIND_BATCH in self._kinds or config.on_demand
        self._profiler: Any = None
        if names.KIND_PROFILE in self._kinds or config.on_demand:
            try:
                self._profiler = load_profiler()
            except ProfilerUnavailable as exc:
                self._warn_once("profiler", "otel_mindformers: profile captures are off: %s", exc)
        self._watcher = store.RequestWatcher(self._root) if config.on_demand else None
        self._pending: list[dict[str, Any]] = []  # on-demand requests not taken yet, oldest first
        self._answers: list[dict[str, Any]] = []  # to requests that took no capture, newest last
        self._size_checked = 0.0  # monotonic seconds: the profile's disk use, measured at most every SIZE_CHECK_SECONDS

    # --- where a rule fired ------------------------------------------------------------------
    def on_alert(self, rule: str, step: int, span: Span | None) -> str | None:
        """A rule fired at sampled step `step`: the capture's folder if one was taken."""
        if not (self._all_rules or rule in self._rules):
            return None
        return self._request(rule, step, span, self._kinds, self._config.profile_steps, request_id=None)

    # --- pipeline worker, sampled steps -------------------------------------------------------
    def on_sampled_step(self, step: int, span: Span | None, ended_at: float) -> None:
        """One stat of the request file; the new requests for this rank queue in the order
        they were made. A cancel acts at once; a capture request is taken by the first
        sampled step that ended (`ended_at`, wall seconds) after it was made (the worker may
        be handling an older step's record when the request appears) and no capture is in
        flight. While a profile runs, its folder's size against `max_bytes` (at most every
        SIZE_CHECK_SECONDS)."""
        if self._profile is not None:
            self._stop_past_max_bytes()
        notes = self._batch_notes
        for older in [noted for noted in list(notes) if noted < step]:  # handled: no rule fires for them now
            notes.pop(older, None)
        if self._watcher is None:
            return
        try:
            fresh = self._watcher.poll()
        except Exception as exc:  # a vanished share: keep training, say it once
            self._warn_once("watch", "otel_mindformers: cannot read capture requests: %s", exc)
            fresh = []
        pending = self._pending
        pending += [request for request in fresh if store.wanted_by(request, self._identity.rank)]
        if any(request.get("cancel") for request in pending):
            self._cancel_through_last(step)
        while pending and self._profile is None:  # one capture in flight at a time
            request = pending[0]
            requested_at = request.get("requested_at")
            if isinstance(requested_at, (int, float)) and requested_at > ended_at:
                return  # made after this step ended: a later sampled step takes it
            pending.pop(0)
            self._take(request, step, span)

    def _take(self, request: dict[str, Any], step: int, span: Span | None) -> None:
        kinds = [k for k in request.get("kinds") or self._kinds if k in names.KINDS] or self._kinds
        steps = int(request.get("steps") or self._config.profile_steps)
        _logger.warning(
            "otel_mindformers: rank %d picked up capture request %s at step %d (%s%s)",
            self._identity.rank,
            request["id"],
            step,
            ", ".join(kinds),
            f", {steps} steps" if names.KIND_PROFILE in kinds else "",
        )
        self._request(names.TRIGGER_ON_DEMAND, step, span, kinds, steps, request_id=request["id"])

    def _cancel_through_last(self, step: int) -> None:
        """`capture --cancel`: the profile in flight stops at the training thread's next step
        end (its folder says `cancelled`); the requests queued before the cancel are dropped,
        those after it stay. Each of them is answered (`store.write_answers`)."""
        last = max(i for i, request in enumerate(self._pending) if request.get("cancel"))
        handled = self._pending[: last + 1]
        del self._pending[: last + 1]  # in place: the caller goes on with the list
        dropped: list[str] = []
        for request in handled:
            if not request.get("cancel"):
                dropped.append(request["id"])
                continue
            cancel_id = request["id"]
            folder = self._ask_stop("cancelled", f"cancelled by request {cancel_id}")
            if folder is not None:
                _logger.warning(
                    "otel_mindformers: rank %d cancels its capture in flight at step %d (request %s): %s",
                    self._identity.rank, step, cancel_id, folder,
                )  # fmt: skip
            else:
                _logger.warning(
                    "otel_mindformers: rank %d has no capture in flight to cancel (request %s)",
                    self._identity.rank,
                    cancel_id,
                )
            self._answer(cancel_id, step, "cancelled" if folder is not None else "nothing in flight", folder)
            for request_id in dropped:
                self._answer(request_id, step, f"dropped by cancel {cancel_id}", None)
            dropped = []
        self._write_answers()

    def _answer(self, request_id: str, step: int, answer: str, folder: Path | None) -> None:
        self._answers.append(
            {
                "id": request_id,
                "rank": self._identity.rank,
                "world_size": self._identity.world_size,
                "step": step,
                "answer": answer,
                "folder": None if folder is None else str(folder),
                "time_stamp": round(time.time(), 3),
            }
        )
        del self._answers[: -store.ANSWERS_KEPT]

    def _write_answers(self) -> None:
        try:
            store.write_answers(self._rank_root, self._answers)
        except (OSError, ValueError) as exc:
            self._warn_once("answers", "otel_mindformers: cannot write the answers to capture requests: %s", exc)

    def _stop_past_max_bytes(self) -> None:
        """A profile longer than its folder's budget stops (status `stopped`) instead of
        filling the disk: `max_bytes` otherwise applies only before a capture starts."""
        now = time.monotonic()
        if self._config.max_bytes <= 0 or now - self._size_checked < SIZE_CHECK_SECONDS:  # 0: unbounded
            return
        self._size_checked = now
        used = store.folder_bytes(self._rank_root)
        if (
            used > self._config.max_bytes
            and self._ask_stop("stopped", f"its folder passed max_bytes ({used} > {self._config.max_bytes} bytes)")
            is not None
        ):
            self._warn_once(
                "max-bytes", "otel_mindformers: stopping the profile in flight: captures use %d bytes, max_bytes is %d",
                used, self._config.max_bytes,
            )  # fmt: skip

    def _ask_stop(self, status: str, reason: str) -> Path | None:
        """The folder of the profile in flight, asked to stop; None where none is."""
        with self._lock:
            profile = self._profile
            if profile is None:
                return None
            profile.stop = (status, reason)
        return profile.folder

    # --- training thread ------------------------------------------------------------------------
    def note_batch(self, cb_params: Any, step: int) -> None:
        """Sampled steps, when `notes_batches`: what identifies this step's batch, kept for a
        capture of it."""
        try:
            note = _batch_note(cb_params, step, self._dataset, self._config.batch_crc32)
        except Exception as exc:  # an odd element: the step alone still identifies it
            self._warn_once("batch", "otel_mindformers: cannot describe the batch: %s", exc)
            note = {"step": step}
        notes = self._batch_notes
        notes[step] = note
        if len(notes) > _BATCH_NOTES:
            notes.pop(min(notes), None)  # the worker may have dropped it meanwhile

    def on_step_end(self, step: int) -> None:
        """While `active`: start the profile at this boundary, or step it."""
        with self._lock:
            profile = self._profile
            if profile is None:
                self.active = False
                return
            if profile.stop is not None:  # cancelled, or past max_bytes: what it took stays
                if profile.session is not None:
                    profile.session.abandon()
                profile.manifest["status"], profile.manifest["reason"] = profile.stop
                self._profile, self.active = None, False
                self._finish(profile, step)
                return
            if profile.session is None:
                self._start_profile(profile, step)
                return
            profile.boundaries.append(time.time_ns())
            try:
                done = profile.session.step()
            except Exception as exc:
                self._warn_once("profile-step", "otel_mindformers: the profiler failed while stepping: %s", exc)
                profile.session.abandon()
                done = True
                profile.manifest["status"] = "failed"
            if done:
                self._profile, self.active = None, False
                self._finish(profile, step)

    def close(self) -> None:
        """Run end: a profile still going is stopped; its folder says it is incomplete."""
        with self._lock:
            profile, self._profile, self.active = self._profile, None, False
        if profile is not None:
            if profile.session is not None:
                profile.session.abandon()
            profile.manifest["status"] = "incomplete"
            self._finish(profile, None)

    # --- the capture --------------------------------------------------------------------------
    def _request(
        self, trigger: str, step: int, span: Span | None, kinds: list[str], steps: int, request_id: str | None
    ) -> str | None:
        on_demand = trigger == names.TRIGGER_ON_DEMAND
        with self._lock:
            skipped = None
            if self._profile is not None:
                skipped = "another capture is in flight"
            elif not on_demand and self._taken >= self._config.max_captures:
                skipped = f"max_captures ({self._config.max_captures}) reached"
            elif (
                not on_demand
                and self._last_triggered_step is not None
                and step - self._last_triggered_step < self._config.cooldown_steps
            ):
                skipped = f"cooldown ({self._config.cooldown_steps} steps since step {self._last_triggered_step})"
            if skipped is not None:
                self._count(",".join(kinds), trigger, "skipped")
                _logger.info("otel_mindformers: no capture for %s at step %d: %s", trigger, step, skipped)
                return None
            if not on_demand:
                self._taken += 1
                self._last_triggered_step = step
            try:
                folder = self._make_folder(step, trigger)
            except OSError as exc:
                self._count(",".join(kinds), trigger, "failed")
                self._warn_once(
                    "folder", "otel_mindformers: captures are off: cannot write under %s: %s", self._root, exc
                )
                return None
            manifest = self._manifest(folder, trigger, step, kinds, steps, request_id)
            profile = None
            if names.KIND_PROFILE in kinds and self._profiler is not None:
                manifest["status"] = "waiting"
                profile = self._profile = _Profile(folder, manifest, steps)  # in flight from here
        # The files outside the lock: the training thread never waits for them.
        taken = []
        if names.KIND_STACKS in kinds and self._write_stacks(folder):
            taken.append(names.KIND_STACKS)
        if names.KIND_BATCH in kinds and self._write_batch(folder, step):
            taken.append(names.KIND_BATCH)
        if profile is not None:
            taken.append(names.KIND_PROFILE)
        manifest["kinds"] = taken
        self._write_manifest(folder, manifest)
        if profile is not None:
            self.active = True  # the training thread starts it at its next step end
            self._progress.wake = True
        self._announce(folder, trigger, step, taken, steps, span)
        return str(folder)

    def _make_folder(self, step: int, trigger: str) -> Path:
        removed = store.make_room(self._rank_root, self._config.max_bytes)
        for old in removed:
            _logger.info("otel_mindformers: removed capture %s (max_bytes %d)", old, self._config.max_bytes)
        base = self._rank_root / store.capture_folder_name(step, trigger)
        folder, n = base, 1
        while folder.exists():
            n += 1
            folder = base.with_name(f"{base.name}-{n}")
        folder.mkdir(parents=True)
        return folder

    def _manifest(
        self, folder: Path, trigger: str, step: int, kinds: list[str], steps: int, request_id: str | None
    ) -> dict[str, Any]:
        identity = self._identity
        return {
            "trigger": trigger,
            "step": step,
            "rank": identity.rank,
            "world_size": identity.world_size,
            "host": identity.host_name,
            "pid": os.getpid(),  # a capture left `waiting` by a process that is gone was interrupted
            "job": identity.job_id,
            "time_stamp": round(time.time(), 6),
            "requested_kinds": kinds,
            "profile_steps": steps if names.KIND_PROFILE in kinds else 0,
            "analysis": self._config.analysis,
            "request_id": request_id,
            "status": "taken",
        }

    def _write_manifest(self, folder: Path, manifest: dict[str, Any]) -> None:
        try:
            store.write_json(folder / names.MANIFEST_FILE, manifest)
        except (OSError, ValueError) as exc:
            self._warn_once("manifest", "otel_mindformers: cannot write capture manifest in %s: %s", folder, exc)

    def _write_stacks(self, folder: Path) -> bool:
        try:
            snapshot = capture_stacks(self._training_ident, skip_current=False)
            (folder / names.STACKS_FILE).write_text(snapshot.text(STACK_TEXT_CHARS), encoding="utf-8")
        except Exception as exc:
            self._warn_once("stacks", "otel_mindformers: stack capture failed: %s", exc)
            return False
        return True

    def _write_batch(self, folder: Path, step: int) -> bool:
        note = self._batch_notes.get(step) or _step_only(step, self._dataset)
        try:
            store.write_json(folder / names.BATCH_FILE, note)
        except (OSError, ValueError) as exc:
            self._warn_once("batch-file", "otel_mindformers: cannot write the batch record: %s", exc)
            return False
        return True

    def _start_profile(self, profile: _Profile, step: int) -> None:
        metadata = json.dumps({"trigger": profile.manifest["trigger"], "first_step": step + 1})
        try:
            profile.session = ProfileSession.start(
                self._profiler,
                profile.folder / names.PROFILE_DIR,
                profile.steps,
                analyse=self._config.analysis == "async",
                device_target=self._identity.device_target,
                metadata=metadata,
            )
        except ProfilerUnavailable as exc:
            self._warn_once("profile-start", "otel_mindformers: profile capture failed: %s", exc)
            self._profile, self.active = None, False
            profile.manifest["status"] = "failed"
            profile.manifest["error"] = str(exc)
            self._count(names.KIND_PROFILE, profile.manifest["trigger"], "failed")
            self._finish(profile, None)
            return
        profile.first_step = step + 1
        profile.boundaries.append(time.time_ns())

    def _finish(self, profile: _Profile, last_step: int | None) -> None:
        """Off the training thread: the manifest, then the wait for the analysed trace."""
        manifest = profile.manifest
        if profile.first_step and len(profile.boundaries) > 1:
            manifest["first_step"] = profile.first_step
            manifest["last_step"] = profile.first_step + len(profile.boundaries) - 2
            manifest["step_windows_ns"] = [
                [profile.first_step + i, start, end]
                for i, (start, end) in enumerate(zip(profile.boundaries, profile.boundaries[1:]))
            ]
        if manifest["status"] == "waiting":
            manifest["status"] = "analysing" if self._config.analysis == "async" else "raw"
        thread = threading.Thread(
            target=self._complete, args=(profile.folder, manifest), name="otel-mindformers-capture", daemon=True
        )
        self._finishers.append(thread)
        thread.start()

    def _complete(self, folder: Path, manifest: dict[str, Any]) -> None:
        self._write_manifest(folder, manifest)
        if manifest["status"] != "analysing":
            return
        deadline = time.monotonic() + ANALYSIS_WAIT_SECONDS
        while time.monotonic() < deadline:
            found = store.traces(folder)
            if found:
                manifest["status"] = "analysed"
                manifest["trace"] = str(found[0])
                self._write_manifest(folder, manifest)
                _logger.info("otel_mindformers: capture trace ready: %s", found[0])
                return
            time.sleep(0.5)

    def _announce(self, folder: Path, trigger: str, step: int, kinds: list[str], steps: int, span: Span | None) -> None:
        attributes: dict[str, Any] = {
            names.ATTR_CAPTURE_PATH: str(folder),
            names.ATTR_CAPTURE_KIND: ",".join(kinds),
            names.ATTR_CAPTURE_TRIGGER: trigger,
            semconv.ATTR_STEP: step,
        }
        profiled = ""
        if names.KIND_PROFILE in kinds:
            # The profile starts at the training thread's next step end: the manifest's
            # `first_step` / `last_step` say which steps it covers.
            attributes[names.ATTR_CAPTURE_STEPS] = steps
            profiled = f"; profiling the next {steps} steps"
        for kind in kinds:
            self._count(kind, trigger, "taken")
        if span is not None and span.is_recording():
            span.add_event(names.EVENT_CAPTURE, attributes)
        text = f"capture ({', '.join(kinds) or 'nothing'}) for {trigger} at step {step}: {folder}{profiled}"
        try:
            self._otel_logger.emit(
                severity_number=SeverityNumber.WARN,
                severity_text="WARNING",
                body=text,
                attributes={**self._point_attributes, **attributes},
                event_name=names.EVENT_CAPTURE,
            )
        except Exception as exc:  # a telemetry failure never takes the capture down with it
            _logger.debug("otel_mindformers: capture log record failed: %s", exc)
        _logger.warning("otel_mindformers: rank %d %s", self._identity.rank, text)

    def _count(self, kind: str, trigger: str, outcome: str) -> None:
        self._counter.add(
            1,
            {
                **self._point_attributes,
                names.ATTR_CAPTURE_KIND: kind,
                names.ATTR_CAPTURE_TRIGGER: trigger,
                names.ATTR_CAPTURE_OUTCOME: outcome,
            },
        )

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _logger.warning(message, *args)


def _dataset_meta(cb_params: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"batch_num": int(cb_params.get("batch_num") or 0)}
    dataset = cb_params.get("train_dataset")
    for key, method in (
        ("dataset_size", "get_dataset_size"),
        ("batch_size", "get_batch_size"),
        ("columns", "get_col_names"),
    ):
        try:
            meta[key] = getattr(dataset, method)()
        except Exception:  # a dataset without that metadata: the record says less
            meta[key] = None
    return meta


def _step_only(step: int, meta: dict[str, Any]) -> dict[str, Any]:
    """Step, epoch and the step's place in its pass over the dataset; the sample range holds
    for an unshuffled dataset only (MindSpore's pipeline does not expose the sampler's
    indices). The dataset's size before `batch_num`: with a `sink_size` the latter is the sink,
    while the data runs on through the dataset (a device's sinks; the CPU's whole epochs)."""
    batch_num = meta.get("dataset_size") or meta.get("batch_num") or 0
    in_epoch = (step - 1) % batch_num + 1 if batch_num else None
    batch_size = meta.get("batch_size")
    record = {
        "step": step,
        "epoch": (step - 1) // batch_num + 1 if batch_num else None,
        "step_in_epoch": in_epoch,
        "dataset_size": meta.get("dataset_size"),
        "batch_size": batch_size,
        "columns": meta.get("columns"),
    }
    if in_epoch and batch_size:
        record["sample_range_if_unshuffled"] = [(in_epoch - 1) * batch_size, in_epoch * batch_size]
    return record


def _batch_note(cb_params: Any, step: int, meta: dict[str, Any], crc: bool) -> dict[str, Any]:
    note = _step_only(step, meta)
    epoch = cb_params.get("cur_epoch_num")
    if epoch:
        note["epoch"] = int(epoch)
    try:
        element = mindspore_model.batch_inputs(cb_params)
    except ApiNotFound as exc:  # the note keeps the step, epoch and place in the epoch
        feature_off("the batch capture's input shapes", exc)
        element = None
    if isinstance(element, (list, tuple)):
        note["inputs"] = [{"shape": list(t.shape), "dtype": str(t.dtype)} for t in element if hasattr(t, "shape")]
        if crc and element and hasattr(element[0], "asnumpy"):
            array = element[0].asnumpy()
            note["crc32_first_input"] = zlib.crc32(array.data if array.flags.c_contiguous else array.tobytes())
    return note
