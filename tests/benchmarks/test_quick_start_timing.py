"""The quick-start benchmark times what README shows: its commands and Python block, read from README."""

from pathlib import Path

from benchmarks.quick_start_timing import python_block, quick_start_section, shell_commands

README = Path(__file__).resolve().parents[2] / "README.md"


def test_commands_and_python_come_from_readme_quick_start():
    section = quick_start_section(README.read_text())
    commands = shell_commands(section)
    assert [c.split()[1] for c in commands] == ["models", "profile", "eval"]
    assert commands[1] == "duocal profile smollm2-135m-instruct --output my-profile.json"  # comment dropped
    assert "--rows full,duo,h2o --contexts 2048" in commands[2]
    code = python_block(section)
    assert 'dr.load_profile("my-profile.json")' in code and "with dr.apply(model, plan)" in code
    compile(code, "quick_start.py", "exec")


def test_a_section_without_commands_gives_none():
    section = quick_start_section(
        "# x\n## Quick start\n```bash\npip install x\n```\n## Next\n```bash\nduocal profile\n```"
    )
    assert shell_commands(section) == []
