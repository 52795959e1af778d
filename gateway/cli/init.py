"""``speclane init``: a starter policy from real endpoints.

    speclane init --spec URL [--spec URL...] --standard URL [--standard URL...]
                  [--out policy.yaml] [--force] [--model NAME] [--k K] [--no-probe]
                  [--default-temperature T]

Asks each endpoint what it serves (``/v1/models``), its version and whether it speculates
(``gateway/setup/probe.py``), recognises the engine and k (``gateway/setup/found.py``),
checks that every endpoint serves the model, and writes a commented policy that lints clean
(``gateway/setup/starter.py``). It says what it found, what to check (a speculative endpoint
that does not speculate, answers without per-request metrics and the flag that adds them),
and what only the operator can decide (prices; a k the server does not show). An existing
file is kept unless ``--force``; an endpoint that does not answer is named with the reason,
and nothing is written. So is nothing when an endpoint's pages contradict its role (a
``--spec`` that does not speculate, a ``--standard`` that does): the message gives the command
the way round the pages say, and the operator runs it. The model's default temperature (what
a request without one is read as) comes from ``--default-temperature``, else the model's
``generation_config.json`` (``gateway/setup/sampling.py``), else a question on a terminal,
else vLLM's 1.0 marked DECIDE. Command-line edge only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.settings import huggingface_cache
from gateway.setup import found as recognised
from gateway.setup import probe, sampling
from gateway.setup.facts import Models
from gateway.setup.found import Found
from gateway.setup.starter import pools, starter
from policies.lint import lint


class InitError(Exception):
    """Why no policy was written, one line per reason."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "init",
        help="write a starter policy from your speculative and standard endpoints",
        description="Reads each endpoint (models, version, speculation counters, one short "
        "request) and writes a commented policy that lints clean.",
    )
    add = parser.add_argument
    add("--spec", action="append", required=True, metavar="URL", help="a speculative endpoint")
    add("--standard", action="append", required=True, metavar="URL", help="a standard one")
    add("--out", type=Path, default=Path("policy.yaml"), help="where to write the policy")
    add("--force", action="store_true", help="overwrite --out when it exists")
    add("--model", help="the model to route (default: the one every endpoint serves)")
    add("--k", type=int, help="num_speculative_tokens, where a server does not show it")
    add(
        "--no-probe",
        dest="probe",
        action="store_false",
        help="send no request: engine and per-request metrics are then judged on pages only",
    )
    add("--timeout", type=float, default=30.0, help="seconds per request to an endpoint")
    add(
        "--default-temperature",
        type=_temperature,
        metavar="T",
        help="the temperature the model samples at when a request sets none (vLLM applies "
        "the model's generation_config.json, else 1.0); default: read from that file where "
        "/v1/models' root leads on this machine, else asked on a terminal, else 1.0 marked "
        "DECIDE",
    )
    parser.set_defaults(run=run)


def _temperature(text: str) -> float:
    try:
        return sampling.parse_temperature(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        sys.stderr.write(f"speclane init: {args.out} exists; --force overwrites it\n")
        return 1
    if args.k is not None and not 1 <= args.k <= 32:
        sys.stderr.write("speclane init: --k must be 1 to 32\n")
        return 2
    try:
        model, found, root = asyncio.run(_read(args))
        refuse_crossed_roles(found)
    except InitError as exc:
        sys.stderr.write("".join(f"speclane init: {line}\n" for line in str(exc).splitlines()))
        return 1
    spec = [item for role, item in found if role == "spec"]
    standard = [item for role, item in found if role == "standard"]
    ladder = pools(spec, standard, args.k)
    written = starter(model, found, ladder, _sampling(args, root))
    report = lint(written.text, str(args.out))
    if report.problems:  # a starter that does not lint clean is a bug here, not theirs
        sys.stderr.write("".join(f"{line}\n" for line in report.lines()))
        return 1
    args.out.write_text(written.text)
    _say(model, found, written.decide, args)
    return 0


def refuse_crossed_roles(found: Sequence[tuple[str, Found]]) -> None:
    """An endpoint whose pages contradict the role it was given stops ``init``: a policy
    with a standard server as its speculative pool (or the reverse) would route every
    slice the wrong way and judge it on the wrong pool's numbers. Given the wrong way
    round, the message is the command the right way round."""
    wrong_spec = [item.url for role, item in found if role == "spec" and item.speculates is False]
    wrong_std = [item.url for role, item in found if role == "standard" and item.speculates]
    if not wrong_spec and not wrong_std:
        return
    lines = [f"{url} was given as --spec but does not speculate" for url in wrong_spec]
    lines += [f"{url} was given as --standard but speculates" for url in wrong_std]
    moved = {*wrong_spec, *wrong_std}
    right_spec = [i.url for r, i in found if (r == "spec") != (i.url in moved)]
    right_std = [i.url for r, i in found if (r == "standard") != (i.url in moved)]
    if right_spec and right_std and not set(right_spec) & set(right_std):
        command = " ".join([*(f"--spec {u}" for u in right_spec)])
        command += " " + " ".join(f"--standard {u}" for u in right_std)
        lines.append(
            "nothing written; the endpoints the way round their pages say (with your other "
            f"options): speclane init {command}"
        )
    else:
        lines.append(
            "nothing written: start the speculative server with --speculative-config and "
            "the standard one without it, and give each its own role"
        )
    raise InitError("\n".join(lines))


def _sampling(args: argparse.Namespace, root: str) -> sampling.Sampling:
    """The model's default temperature: --default-temperature, its generation_config.json,
    the operator's answer on a terminal, or vLLM's 1.0 marked DECIDE."""
    if args.default_temperature is not None:
        return sampling.given(args.default_temperature, "--default-temperature")
    found = sampling.from_files(root, huggingface_cache())
    if found is not None:
        return found
    answer = _ask(root) if sys.stdin.isatty() else None
    if answer is None:
        return sampling.unknown(root)
    return sampling.given(answer, "the operator's answer to speclane init")


def _ask(root: str) -> float | None:
    """The operator's answer on the terminal (empty: vLLM's own default); None when the
    terminal closes first."""
    where = f" ({root})" if root else ""
    question = (
        f"The model's default temperature{where}: what it samples at when a request sets "
        f"none (its generation_config.json; Qwen3 0.6, vLLM's own {sampling.VLLM_DEFAULT:g}) "
        f"[{sampling.VLLM_DEFAULT:g}]: "
    )
    while True:  # asked on stderr: stdout may be a pipe, the question is for the terminal
        sys.stderr.write(question)
        sys.stderr.flush()
        try:
            answer = input().strip()
        except EOFError:
            sys.stderr.write("\n")
            return None
        if not answer:
            return sampling.VLLM_DEFAULT
        try:
            return sampling.parse_temperature(answer)
        except ValueError as exc:
            sys.stderr.write(f"{exc}\n")


async def _read(args: argparse.Namespace) -> tuple[str, list[tuple[str, Found]], str]:
    urls = [("spec", url) for url in args.spec] + [("standard", url) for url in args.standard]
    async with probe.client(args.timeout) as http:
        listed = await asyncio.gather(
            *(probe.models_of(http, url) for _, url in urls), return_exceptions=True
        )
        failed = [str(item) for item in listed if isinstance(item, BaseException)]
        for item in listed:
            if isinstance(item, BaseException) and not isinstance(item, probe.Unreachable):
                raise item
        if failed:
            raise InitError("\n".join(failed))
        models = [item for item in listed if isinstance(item, Models)]
        model = _model(args.model, [url for _, url in urls], models)
        pages = await asyncio.gather(
            *(
                probe.pages_of(http, url, served, model, probe=args.probe)
                for (_, url), served in zip(urls, models, strict=True)
            )
        )
    roots = [m.roots[m.ids.index(model)] for m in models if len(m.roots) == len(m.ids)]
    return (
        model,
        [(role, recognised.recognise(p)) for (role, _), p in zip(urls, pages, strict=True)],
        next((root for root in roots if root), ""),
    )


def _model(wanted: str | None, urls: Sequence[str], models: Sequence[Models]) -> str:
    """The model every endpoint serves: the one asked for, else the first common one."""
    common = [m for m in models[0].ids if all(m in other.ids for other in models)]
    served = "\n".join(
        f"{url} serves {', '.join(m.ids)}" for url, m in zip(urls, models, strict=True)
    )
    if wanted is not None and wanted not in common:
        raise InitError(f"not every endpoint serves {wanted!r}:\n{served}")
    if not common:
        raise InitError(f"the endpoints serve no model in common:\n{served}")
    return wanted or common[0]


def _say(
    model: str, found: Sequence[tuple[str, Found]], decide: Sequence[str], args: argparse.Namespace
) -> None:
    out = [f"model: {model}"]
    for role, item in found:
        out.append(f"{item.url} ({role}): {item.engine.value}" + _k(item))
        out += [f"  {line}" for line in item.evidence]
    warnings = [line for role, item in found for line in recognised.advice(item, role)]
    if args.k is not None:
        warnings += [
            f"{item.url} shows k={item.k}, not --k {args.k}: the server's k is written"
            for _, item in found
            if item.k is not None and item.k != args.k
        ]
    out += [f"check: {line}" for line in warnings]
    out += [f"decide: {line}" for line in decide]
    out.append(f"wrote {args.out} (it lints clean); next: speclane serve --policy {args.out}")
    sys.stdout.write("\n".join(out) + "\n")


def _k(item: Found) -> str:
    if not item.speculates:
        return ", standard" if item.speculates is False else ""
    return f", speculative, k={item.k}" if item.k else ", speculative"
