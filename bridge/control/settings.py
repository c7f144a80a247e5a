"""``[[routes]]`` and ``[flows.NAME]``: which provider, greeting, flow and application a
call gets, and the IVR flows written in the config.

Each key is a ``bridge.settings.setting`` field (what the reader checks and the
reference says); what one route or flow says of the others (provider and flow names)
is checked where the whole config is (``bridge.config``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bridge.settings import Spot, check_ws_url, register_check, setting, tname

__all__ = ["STEP_ACTIONS", "FlowConfig", "FlowStep", "RouteConfig"]


STEP_ACTIONS = ("say", "transfer", "hangup", "app", "voice_agent")


def _transfer_uri(value: str, at: Spot) -> str:
    if value and not value.startswith(("sip:", "sips:", "tel:")):
        at.error(f"expected a sip: or tel: URI, got {value!r}")
    return value


def _branch(raw: object, at: Spot) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        at.error(f"expected a table, got {tname(raw)}")
        return ()
    branch = []
    for k, v in raw.items():
        if not (k in ("timeout", "default") or re.fullmatch(r"[0-9*#A-D]+", k)):
            at.error("expected digits (0-9 * # A-D), 'timeout' or 'default'", f"{at.key}.{k}")
        if not isinstance(v, str):
            at.error("expected a step name", f"{at.key}.{k}")
            continue
        branch.append((k, v))
    return tuple(branch)


@dataclass(frozen=True, slots=True)
class FlowStep:
    """One step of an IVR flow: an action, then where to go."""

    name: str
    say: str = setting("", "text spoken")
    interruptible: bool = setting(
        True, "`false`: caller speech and keys do not cut it (legal notices)"
    )
    gather_max_digits: int = setting(
        0, "collect up to this many digits after (and during) the prompt",
        key="gather.max_digits", lo=0, hi=64,
        default_from=lambda gather: 1 if gather else 0,
        default_doc="`1` with a `gather` table, else `0`",
    )  # fmt: skip
    gather_timeout_s: float = setting(
        5.0, "how long to wait for the digits", key="gather.timeout_s", lo=0.5, hi=600
    )
    gather_terminator: str = setting(
        "#", "the key that ends the digits early", key="gather.terminator"
    )
    branch: tuple[tuple[str, str], ...] = setting(
        (), "digits → step, plus `timeout` and `default`; needs `gather`",
        parse=_branch, type_doc="table", default_doc="",
    )  # fmt: skip
    next: str = setting("", "where to go after `say`", type_doc="step name")
    transfer: str = setting("", "blind transfer", type_doc="`sip:`/`tel:` URI", check=_transfer_uri)
    trunk: str = setting(
        "", "the `[trunks]` entry a `tel:` `transfer` goes through (`\"\"`: the call's own trunk, "
        "if it came in or went out on one)", type_doc="trunk name",
    )  # fmt: skip
    hangup: bool = setting(False, "hang up after `say`")
    app: str = setting(
        "", "hand the call to an application", type_doc="`ws(s)://` URL", check=check_ws_url
    )
    voice_agent: str = setting(
        "", "hand the call to a Kletso voice agent", type_doc="provider name"
    )

    @property
    def gathers(self) -> bool:
        return self.gather_max_digits > 0


def _check_step(values: dict[str, Any], at: Spot) -> None:
    step = FlowStep(**values)
    if step.branch and not step.gathers:
        at.error("a branch needs a gather in the same step", "branch")
    if step.trunk and not step.transfer:
        at.error("a trunk needs a transfer in the same step", "trunk")
    ends = step.hangup or step.transfer or step.app or step.voice_agent
    if not (ends or step.next or step.branch):
        at.reader.err(
            at.path, "step leads nowhere: give next, branch, hangup, transfer, app or voice_agent"
        )
    if not (step.say or ends or step.gathers):
        at.reader.err(
            at.path, "step does nothing: give say, gather, hangup, transfer, app or voice_agent"
        )


register_check(FlowStep, _check_step)


def _first_step(t: Mapping[str, Any]) -> str:
    steps = t.get("steps")
    return next(iter(steps), "") if isinstance(steps, dict) else ""


@dataclass(frozen=True, slots=True)
class FlowConfig:
    """``[flows.NAME]``: an IVR flow written in the config."""

    name: str
    start: str = setting(
        doc="first step", kind="str", default_from=_first_step, type_doc="step name",
        default_doc="the first step written",
    )  # fmt: skip
    steps: tuple[FlowStep, ...] = setting(
        doc="one step (`[flows.NAME.steps.STEP]`, keys below)", kind="tables", item=FlowStep,
        fallback=lambda name: FlowStep(name=name, hangup=True),
    )  # fmt: skip

    def step(self, name: str) -> FlowStep:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)


def _check_flow(values: dict[str, Any], at: Spot) -> None:
    steps: tuple[FlowStep, ...] = values["steps"]
    if not steps:
        at.error("a flow needs at least one step", "steps")
        return
    names = {s.name for s in steps}
    if values["start"] not in names:
        at.error(f"unknown step {values['start']!r}", "start")
    for s in steps:
        sp = f"steps.{s.name}"
        if s.next and s.next not in names:
            at.error(f"unknown step {s.next!r}", f"{sp}.next")
        for digit, target in s.branch:
            if target not in names:
                at.error(f"unknown step {target!r}", f"{sp}.branch.{digit}")


register_check(FlowConfig, _check_flow)


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """``[[routes]]``: which provider, greeting, flow and application a call gets."""

    match: str = setting(
        doc="the key it fits (`*` and `?` as in a shell); two routes with the same `match` are an "
        "error (the second could never be reached)",
        kind="str", default_from=lambda t: "*", type_doc="glob (`*`, `?`)", default_doc="`\"*\"`",
    )  # fmt: skip
    provider: tuple[str, ...] = setting(
        doc="a list is a failover chain: a turn that fails before its first audio is retried "
        "on the next. A route with neither `flow` nor `app` whose first provider is a `kletso` "
        "voice agent hands the call to the agent (greeting included): the caller talks with it "
        "(docs/providers.md)",
        kind="strs", required="a provider name or a failover list",
        type_doc="name or list of names",
    )  # fmt: skip
    greeting: str = setting("", "spoken on answer")
    early_media: str = setting(
        "off", "SIP calls: `greeting` answers `183 Session Progress` with SDP and plays the "
        "call's first turn (the greeting, or a flow's or app's first prompt) before answering "
        "200 when it has played (FreeSWITCH's `pre_answer`, Asterisk's `Progress()`); `only` "
        "never answers: the announcement, then `early_media_status`. An app may decide "
        "sooner with its `answer` or `reject` command (docs/app-protocol.md). The 183 is sent "
        "again every 60 s (docs/sip.md)",
        choices=("off", "greeting", "only"),
    )  # fmt: skip
    early_media_max_s: float = setting(
        150.0, "longest early media (carriers allow 180 s): then `greeting` answers and "
        "`only` ends with `early_media_status`", lo=1.0, hi=180.0, unit="s",
    )  # fmt: skip
    early_media_status: int = setting(
        480, "the final response that ends an `early_media = \"only\"` call (480 Temporarily "
        "Unavailable, 486 Busy Here, 404...)", lo=400, hi=699,
    )  # fmt: skip
    flow: str = setting("", "IVR flow run after the greeting", type_doc="flow name")
    app: str = setting(
        "", "application WebSocket opened per call", type_doc="`ws(s)://` URL", check=check_ws_url
    )
    voice: str = setting("", "overrides the provider's voice")
    fallback_flow: str = setting(
        "", "run when the application cannot be reached", type_doc="flow name"
    )
    fallback_prompt: str = setting(
        "",
        "heard in place of a turn no provider could render (`\"\"`: `[daemon] "
        "fallback_prompt`); rendered and cached at start-up. The app or flow still gets "
        "`provider.error` and the turn ends `provider_error`",
    )  # fmt: skip

    def matches(self, key: str) -> bool:
        if self.match == "*":
            return True
        return re.fullmatch(_glob_to_regex(self.match), key) is not None


def _glob_to_regex(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
