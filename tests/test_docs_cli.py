"""docs/cli.md names every option of every command, each in its command's section.

A command's section is the heading of docs/cli.md that names the command in backticks (`table`, or
`diffsmooth env`; `certify` and `predict` share one), down to the next heading of its level or above.
Every long option a user can type must stand there as a whole word (`--n` is not found inside `--n0`):
each option's names and aliases (`--num-samples`) and a flag's off switch (`--no-one-pass`). The group's
own options (`--version`) may stand anywhere on the page. The commands are walked through the `diffsmooth`
group as `diffsmooth --help` lists them, so a new command or option fails here until the page names it.
"""

import re
from pathlib import Path

import click

from diffsmooth.cli import main

CLI_DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")


def commands(group: click.Group = main, path: tuple = ()) -> list:
    """(name path, command) of every command under `group`, nested groups' commands included."""
    ctx = click.Context(group)
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert "is unavailable" not in (command.help or ""), command.help      # its module must import
        found.append((path + (name,), command))
        if isinstance(command, click.Group):
            found += commands(command, path + (name,))
    return found


def long_options(command: click.Command) -> list:
    """Every long option string of `command`: names, aliases and off switches."""
    return [o for p in command.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts
            if o.startswith("--")]


def sections(text: str) -> dict:
    """{command name as written in a heading's backticks: the section's text}."""
    lines, fenced, found = text.splitlines(), False, {}
    heads = []
    for i, line in enumerate(lines):
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            heads.append((i, len(m.group(1)), m.group(2)))
    for k, (start, level, title) in enumerate(heads):
        end = next((i for i, lv, _ in heads[k + 1:] if lv <= level), len(lines))
        for code in re.findall(r"`([^`]+)`", title):
            name = code.removeprefix("diffsmooth ").strip()
            found[name] = found.get(name, "") + "\n".join(lines[start:end]) + "\n"
    return found


def names(text: str, option: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(option) + r"(?![\w-])", text) is not None


def test_every_command_has_a_section_that_names_each_of_its_options():
    text = CLI_DOC.read_text()
    by_command = sections(text)
    missing = {}
    for path, command in commands():
        section = by_command.get(" ".join(path))
        if section is None:
            missing[" ".join(path)] = "no section (a heading naming it in backticks)"
            continue
        absent = [o for o in long_options(command) if not names(section, o)]
        if absent:
            missing[" ".join(path)] = absent
    assert not missing, f"docs/cli.md misses: {missing}"


def test_the_groups_own_options_are_on_the_page():
    text = CLI_DOC.read_text()
    assert [o for o in long_options(main) if not names(text, o)] == []


def test_sections_and_whole_words():
    page = ("# Top\n`--version`\n## Commands\n### `certify` and `predict`\n`--n0`, `--m/--no-m`\n```\n# not a heading\n"
            "```\n### `table`\n`--plan race`\n## Bug reports: `diffsmooth env`\n`--json`\n")
    found = sections(page)
    assert set(found) == {"certify", "predict", "table", "env"}
    assert names(found["certify"], "--n0") and not names(found["certify"], "--n")
    assert names(found["predict"], "--no-m") and not names(found["certify"], "--plan")
    assert "# not a heading" in found["certify"] and names(found["table"], "--plan")
    assert not names(found["table"], "--json") and names(found["env"], "--json")
