"""Loading configuration at the edge: files, CLI flags, cattrs, and error messages.

``load_config(path, overrides)`` reads a TOML (or ``.json``, any case) file, deep-merges the ``overrides``
dict built from CLI flags over it, renames deprecated aliases, structures the result section by section
(unknown keys rejected) with a strict cattrs converter (no silent ``"5" -> 5`` or ``5.7 -> 5``
coercions) into the frozen tree of :mod:`daemon.config`, then validates every rule.  All problems are raised together
as :class:`ConfigError`, one line each, naming the field path, the rule and the value.

Differences from the reference router (documented in docs/config.md): unknown keys are errors, not
silently ignored; ``--program-scheduling-config-json`` replaces the file's ``[program_scheduling]``
table as a whole (the JSON is a complete Program scheduling configuration with defaults for what it
omits, exactly as in the reference).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
from attrs import frozen
from cattrs.errors import ClassValidationError, IterableValidationError

from actors.core.config import COEFFICIENT_FIELDS, problems
from actors.core.config import PriorityConfig as CorePriorityConfig
from actors.core.costs import reference_calibration_estimates
from daemon.config import AgentdConfig, RoutingConfig
from daemon.dataplane import resolve_processes
from daemon.redact import redact_url
from daemon.reference_flags import (
    FLAGS_DOC,
    add_reference_flags,
    ignored_flags,
    mapped_flag_fields,
    reference_overrides,
)


class ConfigError(Exception):
    """Invalid configuration: ``lines`` holds one message per problem."""

    def __init__(self, lines: list[str]) -> None:
        lines = [redact_url(line) for line in lines]  # a worker URL's user-info is a credential
        super().__init__("\n".join(lines))
        self.lines = lines


@frozen
class ConfigWarning:
    """A startup warning with a stable event name and structured fields (rendered as key=value)."""

    event: str
    message: str
    fields: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        parts = [f"event={self.event}"] + [f"{k}={_kv(v)}" for k, v in self.fields] + [f"message={_kv(self.message)}"]
        return " ".join(parts)


def _kv(v: Any) -> str:
    s = str(v)
    return json.dumps(s, ensure_ascii=False) if (not s or any(c in s for c in ' "=\n')) else s


# --------------------------------------------------------------------------------------------
# Strict converter
# --------------------------------------------------------------------------------------------


def _strict_int(v: Any, _: type) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"must be an integer (got {v!r})")
    return v


def _strict_float(v: Any, _: type) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"must be a number (got {v!r})")
    return float(v)


def _strict_bool(v: Any, _: type) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"must be true or false (got {v!r})")
    return v


def _strict_str(v: Any, _: type) -> str:
    if not isinstance(v, str):
        raise TypeError(f"must be a string (got {v!r})")
    return v


def _strict_str_tuple(v: Any, _: type) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, (list, tuple)):
        raise TypeError(f"must be a list of strings (got {v!r})")
    for item in v:
        if not isinstance(item, str):
            raise TypeError(f"must be a list of strings (got item {item!r})")
    return tuple(v)


class _EntryError(TypeError):
    """One entry of a table of names is invalid: reported as ``field['key']: rule``."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _is_str_keyed_dict(t: Any) -> bool:
    args: tuple[Any, ...] = tuple(getattr(t, "__args__", ()))
    return getattr(t, "__origin__", None) is dict and len(args) == 2 and args[0] is str


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter()

    def strict_str_dict(v: Any, t: Any) -> dict[str, Any]:
        # a table of names (priority.tenant_weights, routing.served_models): cattrs' own messages
        # named Python internals ("'int' object has no attribute 'items'")
        if not isinstance(v, Mapping):
            raise TypeError(f"must be a table/object (got {v!r})")
        out = {}
        for key, item in v.items():
            try:
                out[key] = conv.structure(item, t.__args__[1])
            except Exception as exc:
                raise _EntryError(key, _describe(exc)) from None
        return out

    conv.register_structure_hook_func(_is_str_keyed_dict, strict_str_dict)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook_func(lambda t: t == tuple[str, ...], _strict_str_tuple)
    return conv


_CONVERTER = _make_converter()
# Bookkeeping fields are never read from input: a file naming them gets "unknown key".
_NOT_INPUT = frozenset({"explicit_coefficients", "deprecated_inputs"})


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        return "; ".join(cattrs.transform_error(exc, path="value"))
    text = str(exc)
    return text if text.startswith("must") else f"invalid value ({text})"


def _structure_section(cls: type, raw: Any, path: str, errors: list[str]) -> Any:
    """Structure one attrs class field by field, collecting every error instead of stopping at the
    first; a field that fails keeps its default so that the remaining rules can still be checked."""
    if not isinstance(raw, Mapping):
        errors.append(f"{path or 'config'}: must be a table/object (got {raw!r})")
        return cls()
    fields = {a.name: a for a in attrs.fields(cls) if a.name not in _NOT_INPUT}
    for key in raw:
        if key not in fields:
            sections = [] if path else _sections_with_field(cls, key)
            if sections:
                where = ", ".join(f"[{name}]" for name in sections)
                which = "that table" if len(sections) == 1 else "one of them"
                errors.append(f"{key}: unknown key at the top level (a field of {where}: put it under {which})")
            else:
                errors.append(
                    f"{path + '.' if path else ''}{key}: unknown key (not a configuration field{_hint(key, fields)})"
                )
    kwargs: dict[str, Any] = {}
    ftypes = {f.name: f.type for f in attrs.fields(attrs.resolve_types(cls))}
    for name in fields:
        if name not in raw:
            continue
        where = f"{path}.{name}" if path else name
        ftype = ftypes[name]
        value = raw[name]
        inner = _attrs_class_of(ftype)
        if inner is not None and value is not None:
            kwargs[name] = _structure_section(inner, value, where, errors)
            continue
        if inner is not None and ftype is inner:
            # a section given as null (JSON): it said "invalid value (argument of type 'NoneType'
            # is not iterable)"; only an optional section (program_scheduling) may be null
            errors.append(f"{where}: must be a table/object (got None)")
            continue
        item = _attrs_item_of(ftype)
        if item is not None:  # an array of tables, e.g. [[priority.rules]]
            if isinstance(value, list):
                kwargs[name] = tuple(_structure_section(item, v, f"{where}[{i}]", errors) for i, v in enumerate(value))
            else:
                errors.append(f"{where}: must be an array of tables (got {value!r})")
            continue
        try:
            kwargs[name] = _CONVERTER.structure(value, ftype)
        except _EntryError as exc:
            errors.append(f"{where}[{exc.key!r}]: {exc}")
        except Exception as exc:  # cattrs raises many types; each becomes one message naming the field
            errors.append(f"{where}: {_describe(exc)}")
    return cls(**kwargs)


def _hint(key: Any, fields: Mapping[str, Any]) -> str:
    """``; did you mean NAME?`` for a typo of a field of the section (``prot`` -> ``port``,
    ``[sever]`` -> ``server``), else nothing."""
    if not isinstance(key, str):
        return ""
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _sections_with_field(cls: type, key: str) -> list[str]:
    """The sections that have a field ``key``: an unknown top-level key that belongs in one (a file
    of ``[program_scheduling]`` fields such as configs/program-scheduling.json given as the whole
    configuration) was reported as "not a configuration field"."""
    ftypes = {f.name: f.type for f in attrs.fields(attrs.resolve_types(cls))}
    return [name for name, t in ftypes.items() if (inner := _attrs_class_of(t)) and key in attrs.fields_dict(inner)]


def _attrs_item_of(t: Any) -> type | None:
    """``C`` for ``tuple[C, ...]`` with ``C`` an attrs class; None otherwise."""
    args: tuple[Any, ...] = tuple(getattr(t, "__args__", ()))
    if getattr(t, "__origin__", None) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _attrs_class_of(args[0])
    return None


def _attrs_class_of(t: Any) -> type | None:
    """``C`` for an attrs class ``C`` or ``C | None``; None otherwise."""
    if isinstance(t, type) and attrs.has(t):
        return t
    args = [x for x in getattr(t, "__args__", ()) if x is not type(None)]
    if len(args) == 1 and isinstance(args[0], type) and attrs.has(args[0]):
        return args[0]
    return None


# --------------------------------------------------------------------------------------------
# Raw-dict preparation: aliases, explicit coefficients, enablement
# --------------------------------------------------------------------------------------------

_PS_ALIASES = {
    "token_capacity_per_target": "token_capacity_per_dp_rank",
    "enable_key": "program_scheduling_enable_key",
}


def _prepare_program_scheduling(raw: Any, path: str, errors: list[str]) -> tuple[Any, frozenset[str], tuple[str, ...]]:
    if not isinstance(raw, Mapping):
        return raw, frozenset(), ()
    ps = dict(raw)
    deprecated: list[str] = []
    for alias, name in _PS_ALIASES.items():
        if alias in ps:
            if name in ps:
                errors.append(f"{path}.{alias}: is an alias of {name}; give only one of them (got both)")
                del ps[alias]
                continue
            ps[name] = ps.pop(alias)
            if alias == "token_capacity_per_target":
                deprecated.append(alias)
    explicit = set()
    for dotted in COEFFICIENT_FIELDS:
        section, key = dotted.split(".")
        sub = ps.get(section)
        if isinstance(sub, Mapping) and key in sub:
            explicit.add(dotted)
    return ps, frozenset(explicit), tuple(deprecated)


# The seed's JSON shape for the batch-job parameters: ``{"scheduler_config": {"batch_job_sched_config":
# {...}}}`` is read as ``[batch_jobs]``; its errors name the path the file used.
SEED_BATCH_PATH = "scheduler_config.batch_job_sched_config"


def _take_seed_batch_shape(raw: dict[str, Any], errors: list[str]) -> bool:
    """Move ``scheduler_config.batch_job_sched_config`` to ``batch_jobs`` in ``raw``; True if it did."""
    if "scheduler_config" not in raw:
        return False
    sc = raw.pop("scheduler_config")
    if not isinstance(sc, Mapping):
        errors.append(f"scheduler_config: must be a table/object (got {sc!r})")
        return False
    for key in sc:
        if key != "batch_job_sched_config":
            errors.append(f"scheduler_config.{key}: unknown key (only batch_job_sched_config is read)")
    if "batch_job_sched_config" not in sc:
        return False
    if "batch_jobs" in raw:
        errors.append(f"batch_jobs: given twice, as batch_jobs and as {SEED_BATCH_PATH}; give only one of them")
        return False
    raw["batch_jobs"] = sc["batch_job_sched_config"]
    return True


def _seed_batch_path(line: str) -> str:
    """An error line about ``batch_jobs`` renamed to the seed's path the file used."""
    for head in ("batch_jobs.", "batch_jobs:"):
        if line.startswith(head):
            return SEED_BATCH_PATH + line[len("batch_jobs") :]
    return line


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if k == "program_scheduling":
            out[k] = v  # the JSON is a complete Program scheduling config: replace, never merge
        elif isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def read_problem(exc: OSError | UnicodeDecodeError) -> str:
    """Why a file named by the configuration could not be read, in the operating system's words
    (``No such file or directory``, ``Is a directory``) or ``not UTF-8 text (byte 0xf0 at offset 0)``;
    the same words for every such file (the API key file said ``[Errno 2] No such file or
    directory: '/x'``, the worker key file ``IsADirectoryError``)."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    return exc.strerror or type(exc).__name__


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose key repeats is refused, as TOML refuses it (``json`` kept the last value
    silently: ``{"server": {"port": 1, "port": 2}}`` ran on port 2)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


# What a configuration "file" that can be read only once held (a pipe: `--config <(gen-config)`,
# `/dev/stdin`), by path: a command reads its file more than once (the configuration, the empty-file
# warning, the log format before validation), and every read after the first found the pipe empty,
# so `agentd check-config --config <(cat agentd.toml)` ran on the defaults with a "sets no field"
# warning.
_read_once: dict[str, bytes] = {}


def _config_bytes(p: Path) -> bytes:
    key = str(p)
    if key in _read_once:
        return _read_once[key]
    regular = True
    with contextlib.suppress(OSError):  # a missing file is reported by the read below
        regular = stat.S_ISREG(p.stat().st_mode)
    data = p.read_bytes()
    if not regular:
        _read_once[key] = data
    return data


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = _config_bytes(p)
    except OSError as exc:
        raise ConfigError([f"config: cannot read {str(p)!r} ({read_problem(exc)})"]) from None
    is_json = p.suffix.lower() == ".json"  # CONFIG.JSON too: it was read as TOML
    kind = "JSON" if is_json else "TOML"
    try:
        # utf-8-sig: a byte-order mark (some Windows editors write one) is not part of the text;
        # it was "Invalid statement (at line 1, column 1)" on a file that looked right
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"config: {str(p)!r} is not a {kind} file: {read_problem(exc)}"]) from None
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicate_keys) if is_json else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, _DuplicateKey) as exc:
        raise ConfigError([f"config: {str(p)!r} is not valid {kind} ({exc})"]) from None
    if not isinstance(raw, dict):
        raise ConfigError([f"config: {str(p)!r} must hold a table/object at the top level (got {type(raw).__name__})"])
    return raw


def config_from_dict(raw: Mapping[str, Any]) -> AgentdConfig:
    """Structure and validate a raw mapping; raise ConfigError with every problem."""
    raw = dict(raw)
    errors: list[str] = []
    explicit: frozenset[str] = frozenset()
    deprecated: tuple[str, ...] = ()
    enabled = raw.get("enable_program_scheduling", False)
    if enabled is True and raw.get("program_scheduling") is None:
        raw["program_scheduling"] = {}
    if "program_scheduling" in raw:
        raw["program_scheduling"], explicit, deprecated = _prepare_program_scheduling(
            raw["program_scheduling"], "program_scheduling", errors
        )
    seed_batch = _take_seed_batch_shape(raw, errors)
    cfg: AgentdConfig = _structure_section(AgentdConfig, raw, "", errors)
    if not isinstance(enabled, bool):
        # Already reported as a type error; do not add a cascading "section without enable" error.
        cfg = attrs.evolve(cfg, enable_program_scheduling=cfg.program_scheduling is not None)
    if cfg.program_scheduling is not None:
        cfg = attrs.evolve(
            cfg,
            program_scheduling=attrs.evolve(
                cfg.program_scheduling, explicit_coefficients=explicit, deprecated_inputs=deprecated
            ),
        )
    errors.extend(problems(cfg))
    admin = raw.get("admin")
    if isinstance(admin, Mapping) and "host" in admin and admin.get("port") is None:
        # as for [prometheus]: a host alone (--admin-host without --admin-port) opened no listener
        # and left the operator routes on the public port, silently
        errors.append("admin.port: must be set when admin.host is set (got None)")
    if seed_batch:
        errors = [_seed_batch_path(line) for line in errors]
    if errors:
        raise ConfigError(errors)
    return cfg


def load_config(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> AgentdConfig:
    """Read ``path`` (or start from defaults when None), apply ``overrides``, validate everything."""
    raw: dict[str, Any] = read_config_file(path) if path is not None else {}
    if overrides:
        raw = _deep_merge(raw, overrides)
    return config_from_dict(raw)


# --------------------------------------------------------------------------------------------
# The reference router's CLI flags
# --------------------------------------------------------------------------------------------


def add_router_flags(parser: argparse.ArgumentParser) -> None:
    """Flags accepted for compatibility with the reference router's launch command."""
    g = parser.add_argument_group("reference-router-compatible flags (override the config file)")
    g.add_argument("--host", help="address to listen on (server.host)")
    g.add_argument("--port", type=int, help="port to listen on, 0 for any free port (server.port)")
    g.add_argument("--worker-urls", nargs="+", metavar="URL", help="vLLM-compatible workers (routing.worker_urls)")
    g.add_argument(
        "--intra-node-data-parallel-size",
        type=int,
        metavar="N",
        help="internal DP ranks behind each worker URL (routing.intra_node_data_parallel_size)",
    )
    g.add_argument("--policy", help="native request-level policy for identity-free requests (routing.policy)")
    g.add_argument("--prometheus-host", help="extra /metrics listener address (prometheus.host)")
    g.add_argument("--prometheus-port", type=int, help="extra /metrics listener port (prometheus.port)")
    g.add_argument(
        "--enable-program-scheduling",
        action="store_true",
        default=None,
        help="turn Program scheduling on (enable_program_scheduling)",
    )
    g.add_argument(
        "--program-scheduling-config-json",
        metavar="JSON",
        help="Program scheduling configuration as one JSON object; requires --enable-program-scheduling",
    )
    g.add_argument(
        "--api-keys-file", metavar="PATH", help="agentd extra: API keys, tenant:sha256 lines (auth.api_keys_file)"
    )
    g.add_argument("--admin-host", help="agentd extra: admin listener address (admin.host)")
    g.add_argument("--admin-port", type=int, help="agentd extra: admin listener port (admin.port)")
    g.add_argument(
        "--data-plane-processes",
        type=int,
        metavar="N",
        help="agentd extra: relay processes on the port, 1 = one process, 0 = auto (server.data_plane_processes)",
    )
    g.add_argument("--log-level", help="debug, info, warning, error or critical (server.log_level)")
    g.add_argument("--log-format", help="kv (key=value lines) or json (server.log_format)")
    add_reference_flags(parser)


# Field path -> (flag, argparse dest) of add_router_flags' own flags: a configuration error about a
# field a flag set names the flag too (the operator typed the flag, not the field).
_FLAG_FIELDS: dict[str, tuple[str, str]] = {
    "server.host": ("--host", "host"),
    "server.port": ("--port", "port"),
    "server.log_level": ("--log-level", "log_level"),
    "server.log_format": ("--log-format", "log_format"),
    "server.data_plane_processes": ("--data-plane-processes", "data_plane_processes"),
    "routing.worker_urls": ("--worker-urls", "worker_urls"),
    "routing.intra_node_data_parallel_size": ("--intra-node-data-parallel-size", "intra_node_data_parallel_size"),
    "routing.policy": ("--policy", "policy"),
    "prometheus.host": ("--prometheus-host", "prometheus_host"),
    "prometheus.port": ("--prometheus-port", "prometheus_port"),
    "auth.api_keys_file": ("--api-keys-file", "api_keys_file"),
    "admin.host": ("--admin-host", "admin_host"),
    "admin.port": ("--admin-port", "admin_port"),
    "program_scheduling": ("--program-scheduling-config-json", "program_scheduling_config_json"),
    **mapped_flag_fields(),
}


def name_flags(lines: list[str], args: argparse.Namespace) -> list[str]:
    """``routing.policy: ...`` -> ``routing.policy (--policy): ...`` for each line about a field a
    flag given on the command line set (``program_scheduling.*`` names --program-scheduling-config-json).

    Another field the line names, set by its flag, is named the same way (``... when prometheus.host
    (--prometheus-host) is set``), and then so is the line's own field when it is missing
    (``prometheus.port (--prometheus-port): must be set ...``): the operator typed the other flag and
    must add this one."""
    out = []
    for line in lines:
        path, sep, rest = line.partition(":")
        if not sep:
            out.append(line)
            continue
        head = path.split("[", 1)[0]
        own = next((f for f in _FLAG_FIELDS if head == f or head.startswith(f + ".")), None)
        given = own is not None and getattr(args, _FLAG_FIELDS[own][1], None) is not None
        named_other = False
        for field, (flag, dest) in _FLAG_FIELDS.items():
            if field == own or getattr(args, dest, None) is None:
                continue
            mention = re.compile(rf"(?<![\w.]){re.escape(field)}(?![\w.=(])(?! \(--)")
            rest, count = mention.subn(f"{field} ({flag})", rest)
            named_other = named_other or count > 0
        if own is not None and (given or (named_other and rest.endswith("(got None)"))):
            path = f"{path} ({_FLAG_FIELDS[own][0]})"
        out.append(f"{path}:{rest}")
    return out


def load_config_from_args(path: str | Path | None, args: argparse.Namespace) -> AgentdConfig:
    """:func:`load_config` with the command line's flags; an error about a field a flag set names
    the flag."""
    try:
        overrides = overrides_from_args(args)
        _bound_by_request_timeout(path, overrides)
        return load_config(path, overrides)
    except ConfigError as error:
        raise ConfigError(name_flags(error.lines, args)) from None


# agentd's upstream timeouts that must not exceed routing.request_timeout_seconds
_WITHIN_REQUEST_TIMEOUT = ("first_byte_timeout_seconds", "stream_idle_timeout_seconds")


def _bound_by_request_timeout(path: str | Path | None, overrides: dict[str, Any]) -> None:
    """The reference's ``--request-timeout-secs`` is one bound on the whole request: below agentd's
    first-byte or stream-idle default it lowers that timeout too (unless the file sets it), instead
    of failing their ``<= request_timeout_seconds`` rule (docs/operations.md §13.10)."""
    routing = overrides.get("routing", {})
    total = routing.get("request_timeout_seconds")
    if not isinstance(total, (int, float)):
        return
    in_file: Any = read_config_file(path).get("routing", {}) if path is not None else {}
    defaults = RoutingConfig()
    for key in _WITHIN_REQUEST_TIMEOUT:
        if key in routing or (isinstance(in_file, Mapping) and key in in_file):
            continue
        if getattr(defaults, key) > total:
            routing[key] = total


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Turn the router-compatible flags into a nested override dict; raise ConfigError on bad JSON
    or a reference flag agentd refuses (every such problem at once)."""
    over: dict[str, Any] = {}
    reference, refused = reference_overrides(args)
    for section, values in reference.items():
        over.setdefault(section, {}).update(values)

    def put(section: str, key: str, value: Any) -> None:
        if value is not None:
            over.setdefault(section, {})[key] = value

    put("server", "host", getattr(args, "host", None))
    put("server", "port", getattr(args, "port", None))
    put("server", "log_level", getattr(args, "log_level", None))
    put("server", "log_format", getattr(args, "log_format", None))
    put("server", "data_plane_processes", getattr(args, "data_plane_processes", None))
    urls = getattr(args, "worker_urls", None)
    put("routing", "worker_urls", list(urls) if urls else None)
    put("routing", "intra_node_data_parallel_size", getattr(args, "intra_node_data_parallel_size", None))
    put("routing", "policy", getattr(args, "policy", None))
    put("prometheus", "host", getattr(args, "prometheus_host", None))
    put("prometheus", "port", getattr(args, "prometheus_port", None))
    put("auth", "api_keys_file", getattr(args, "api_keys_file", None))
    put("admin", "host", getattr(args, "admin_host", None))
    put("admin", "port", getattr(args, "admin_port", None))
    enabled = getattr(args, "enable_program_scheduling", None)
    ps_json = getattr(args, "program_scheduling_config_json", None)
    if ps_json is not None:
        if not enabled:
            refused.append(
                "program_scheduling_config_json: requires enable_program_scheduling (pass --enable-program-scheduling)"
            )
        else:
            try:
                ps = json.loads(ps_json)
            except json.JSONDecodeError as exc:
                refused.append(f"program_scheduling_config_json: is not valid JSON ({exc})")
            else:
                if isinstance(ps, dict):
                    over["program_scheduling"] = ps
                else:
                    refused.append(f"program_scheduling_config_json: must be a JSON object (got {ps!r})")
    if refused:
        raise ConfigError(refused)
    if enabled:
        over["enable_program_scheduling"] = True
    return over


def config_file_warnings(path: str | Path | None) -> list[ConfigWarning]:
    """``config_file_empty`` for a configuration file that sets nothing (an empty file, or only
    comments): the defaults run, which a file given on purpose rarely means (a truncated write, the
    wrong file); it was accepted without a word."""
    if path is None:
        return []
    try:
        raw = read_config_file(path)
    except ConfigError:
        return []  # reported as an error already
    if raw:
        return []
    return [
        ConfigWarning(
            "config_file_empty",
            f"{str(path)!r} sets no field: every setting is the default (docs/config.md)",
            (("path", str(path)),),
        )
    ]


def ignored_flag_warnings(args: argparse.Namespace) -> list[ConfigWarning]:
    """One ``reference_flag_ignored`` warning per reference-router flag given that agentd accepts and
    ignores (``daemon.reference_flags``)."""
    return [
        ConfigWarning(
            "reference_flag_ignored",
            f"{u.flag} is the reference router's and is ignored: {u.reason} ({FLAGS_DOC})",
            (("flag", u.flag),),
        )
        for u in ignored_flags(args)
    ]


# --------------------------------------------------------------------------------------------
# Warnings and dumping
# --------------------------------------------------------------------------------------------


def _scheduler_priority_fields(cfg: AgentdConfig) -> list[str]:
    """The ``[priority]`` fields only the scheduler reads (``actors.core.config.PriorityConfig``) that
    differ from their defaults, when Program scheduling is off (so there is no scheduler)."""
    if cfg.enable_program_scheduling:
        return []
    core, default = cfg.priority.core(), CorePriorityConfig()
    return [a.name for a in attrs.fields(CorePriorityConfig) if getattr(core, a.name) != getattr(default, a.name)]


def _total_ranks(cfg: AgentdConfig) -> int:
    """DP ranks over every worker: the largest model pool there can be."""
    if cfg.embedded_mode:
        return cfg.embedded.num_workers * cfg.embedded.dp_size
    return len(cfg.worker_urls()) * cfg.routing.intra_node_data_parallel_size


# vLLM's OpenAI server (uvicorn) closes idle keep-alive connections after 5 s by default
WORKER_IDLE_TIMEOUT_SECONDS = 5.0


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")


def _exposure_warnings(cfg: AgentdConfig) -> list[ConfigWarning]:
    """Operator listeners on every interface, and TLS to workers without certificate checks
    (docs/operations.md §10.2, §10.6): both are legal, and both expose what the rest of the
    configuration protects."""
    out: list[ConfigWarning] = []
    listeners = (
        ("admin", cfg.admin.host, cfg.admin.port),
        ("prometheus", cfg.prometheus.bind_host, cfg.prometheus.port),
    )
    for section, host, port in listeners:
        if port is not None and host in WILDCARD_HOSTS:
            out.append(
                ConfigWarning(
                    "operator_listener_on_every_interface",
                    f"{section}.host = {host!r} serves "
                    + (
                        "the operator routes (/scheduling/diagnostics, /metrics, /dashboard)"
                        if section == "admin"
                        else "/metrics"
                    )
                    + " on every interface, and that listener never asks for a key: bind it to 127.0.0.1 or a "
                    "management interface (docs/operations.md §10.2)",
                    (("listener", section), ("host", host), ("port", port)),
                )
            )
    https = [url for url in cfg.routing.worker_urls if url.lower().startswith("https://")]
    if https and not cfg.worker_tls.verify:
        out.append(
            ConfigWarning(
                "worker_tls_unverified",
                "worker_tls.verify = false: the certificates of https:// workers are not checked, so anyone on the "
                "path can pose as a worker and read every prompt (for tests only; docs/operations.md §10.6)",
                (("https_workers", len(https)),),
            )
        )
    return out


def config_warnings(cfg: AgentdConfig) -> list[ConfigWarning]:
    out: list[ConfigWarning] = []
    keepalive = cfg.routing.keepalive_expiry_seconds
    if cfg.routing.worker_urls and keepalive >= WORKER_IDLE_TIMEOUT_SECONDS:
        out.append(
            ConfigWarning(
                "keepalive_expiry_not_below_worker_idle_timeout",
                f"routing.keepalive_expiry_seconds ({keepalive:g}) is not below vLLM's default idle keep-alive "
                f"timeout ({WORKER_IDLE_TIMEOUT_SECONDS:g} s): requests may race a worker closing an idle "
                "connection (docs/operations.md §11.2); keep it lower unless your workers keep connections longer",
                (("keepalive_expiry_seconds", keepalive),),
            )
        )
    out.extend(_exposure_warnings(cfg))
    if cfg.priority.interactive_scheduling and not cfg.enable_program_scheduling:
        out.append(
            ConfigWarning(
                "interactive_scheduling_without_scheduler",
                "priority.interactive_scheduling has no effect without enable_program_scheduling: "
                "identity-free requests take the native policy (docs/priority.md §5.5)",
            )
        )
    unused = _scheduler_priority_fields(cfg)
    if unused:
        out.append(
            ConfigWarning(
                "priority_without_scheduler",
                f"priority.{', priority.'.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect without "
                "enable_program_scheduling: class bands, caps and tenant fairness are the scheduler's; without it "
                "agentd only reads priorities and applies priority.rules at the edge (docs/priority.md §5)",
                (("fields", ",".join(unused)),),
            )
        )
    ranks = _total_ranks(cfg)
    reserved = cfg.priority.interactive_reserved_ranks
    if cfg.enable_program_scheduling and isinstance(reserved, int) and reserved > 0 and reserved >= ranks:
        out.append(
            ConfigWarning(
                "interactive_reserved_ranks_cover_every_rank",
                f"priority.interactive_reserved_ranks = {reserved} reserves no rank: a model pool never has all its "
                f"ranks reserved, and this deployment has {ranks} (docs/priority.md §2); use at most {ranks - 1}",
                (("interactive_reserved_ranks", reserved), ("ranks", ranks)),
            )
        )
    if cfg.embedded_mode and cfg.server.data_plane_processes != 1:
        out.append(
            ConfigWarning(
                "data_plane_processes_embedded",
                f"server.data_plane_processes = {cfg.server.data_plane_processes} has no effect in embedded mode "
                "(no worker_urls): the simulated workers live in the one process (docs/operations.md §13)",
                (("data_plane_processes", cfg.server.data_plane_processes),),
            )
        )
    if cfg.auth.admin_keys and not cfg.auth.enabled and cfg.admin.port is None:
        # admin keys are asked for only once API keys are configured (docs/operations.md §10.2): alone
        # they protected nothing, and the operator routes stayed open to anyone on the public port
        out.append(
            ConfigWarning(
                "admin_keys_without_api_keys",
                "auth.admin_keys has no effect without API keys (auth.api_keys or auth.api_keys_file): the "
                "operator routes (/scheduling/diagnostics, /metrics, /dashboard) need no key; give them an "
                "[admin] listener or configure API keys (docs/operations.md §10.2)",
            )
        )
    processes = resolve_processes(cfg.server.data_plane_processes, embedded=cfg.embedded_mode)
    if cfg.priority.requeue_long_prefills is True and processes > 1:
        # a contradiction that was silent: every relay request is answered not_requeueable and runs on
        out.append(
            ConfigWarning(
                "requeue_long_prefills_with_relays",
                f"priority.requeue_long_prefills has no effect with relay processes (server.data_plane_processes = "
                f"{cfg.server.data_plane_processes}, {processes} processes): only the in-process proxy takes a "
                "long prefill back; a relay's requests run on (docs/priority.md §3)",
                (("data_plane_processes", cfg.server.data_plane_processes),),
            )
        )
    ps = cfg.program_scheduling
    if ps is None:
        return out
    for alias in ps.deprecated_inputs:
        out.append(
            ConfigWarning(
                "deprecated_config_alias",
                f"program_scheduling.{alias} is deprecated; use program_scheduling.{_PS_ALIASES[alias]}",
                (("alias", f"program_scheduling.{alias}"),),
            )
        )
    defaulted = ps.defaulted_coefficients()
    # the embedded simulated ranks run the reference cost model itself: its coefficients are their
    # exact calibration, so the warning would be a false alarm on every quick start (docs/program-scheduling.md)
    if not ps.binding_only and defaulted and not cfg.embedded_mode:
        est = reference_calibration_estimates(ps.prefill_cost_model, ps.decode_throughput_model)
        out.append(
            ConfigWarning(
                "program_scheduling_reference_calibration",
                "Program scheduling uses reference calibration coefficients; a deployment that differs from "
                "the reference can degrade admission, TTL and batch-gain decisions. Calibrate and set all seven.",
                (
                    ("defaulted_fields", ",".join(defaulted)),
                    ("reference_prefill_tokens", est.reference_prefill_tokens),
                    ("reference_prefill_seconds", round(est.reference_prefill_seconds, 4)),
                    ("reference_decode_batch_size", est.reference_decode_batch_size),
                    ("reference_decode_context_tokens_per_request", est.reference_decode_context_tokens_per_request),
                    ("reference_decode_context_tokens", est.reference_decode_context_tokens),
                    (
                        "reference_decode_throughput_tokens_per_second",
                        round(est.reference_decode_throughput_tokens_per_second, 4),
                    ),
                    ("calibration_docs", "docs/program-scheduling.md#11-offline-calibration-models"),
                ),
            )
        )
    return out


def dump_config(cfg: AgentdConfig) -> dict[str, Any]:
    """The effective configuration as plain data (defaults filled in; bookkeeping fields left out)."""
    data = _CONVERTER.unstructure(cfg)
    data["routing"]["worker_urls"] = list(data["routing"]["worker_urls"])
    ps = data.get("program_scheduling")
    if ps is not None:
        ps.pop("explicit_coefficients", None)
        ps.pop("deprecated_inputs", None)
        if ps.get("token_capacity_per_dp_rank") is None:
            ps.pop("token_capacity_per_dp_rank", None)
    else:
        data.pop("program_scheduling", None)
    for section in ("prometheus", "admin", "limits"):
        data[section] = {k: v for k, v in data[section].items() if v is not None}
    if "port" not in data["admin"]:
        # no admin listener: its default host alone would not load again (a host needs a port)
        data["admin"] = {}
    if data["worker_auth"]["api_key"]:
        data["worker_auth"]["api_key"] = "***"  # a credential is never printed
    # nor a worker URL's user-info (worker_urls and the tables keyed by worker URL), as everywhere
    # else agentd shows a URL (docs/operations.md §10.5)
    return _redacted_urls(data)


def _redacted_urls(value: Any) -> Any:
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, dict):
        return {redact_url(k) if isinstance(k, str) else k: _redacted_urls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted_urls(v) for v in value]
    return value
