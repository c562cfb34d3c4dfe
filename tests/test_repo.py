"""Repository invariants: README commands, CI entry point, generated docs, changelog."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.noise import noise_lines

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index("```bash") < 40, "the README must start with its set-up commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_exactly_two_setup_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    assert "examples/train_cora.py" in commands[0]
    assert "pytest" in commands[1]


@pytest.mark.multiprocess
def test_readme_first_command_prints_no_warning(tmp_path: Path) -> None:
    """The README's first command (shortened to 3 epochs) prints its figures and nothing the user did not cause."""
    command = _readme_commands()[0].split("&&")[-1].split()
    assert command[:2] == ["python", "examples/train_cora.py"], command
    command[command.index("--epochs") + 1] = "3"
    env = dict(os.environ, LIGHTNING_HALO_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", "PYTHONWARNINGS"):
        env.pop(key, None)
    run = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert [line.split()[1] for line in output.splitlines() if line.startswith("epoch ")] == ["0", "1", "2"], output
    assert "test_acc" in output and "training halo traffic" in output
    assert noise_lines(output) == [], output


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci.splitlines()


def test_ci_opts_in_to_the_multi_node_test_and_users_are_told_how() -> None:
    from tests.test_slurm import OPT_IN

    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    readme_test_command = ci.index(_readme_commands()[1])
    assert f"export {OPT_IN}=1" in ci[:readme_test_command], "CI must run the real SLURM test"
    readme = (ROOT / "README.md").read_text()
    assert f"{OPT_IN}=1" in readme and 'python -m pytest -q -m "not slow"' in readme


def test_generated_docs_are_current() -> None:
    """``python tools/gen_docs.py --check``, forked from the tests' preloaded server (its commands fork from it)."""
    from benchmarks.launch import run_forked
    from tests.support.launch import PRELOAD

    result = run_forked(["tools/gen_docs.py", "--check"], dict(os.environ), ROOT, PRELOAD)
    assert result.returncode == 0, result.stdout + result.stderr


def test_where_things_live_maps_every_folder_and_module_of_the_package() -> None:
    """docs/concepts.md's map names every subpackage and top-level module, and only ones that exist."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    section = text[text.index("## Where things live") :]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    named = {name for where, _ in rows for name in re.findall(r"`([^`]+)`", where)}
    package = ROOT / "lightning_halo"
    present = {f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    present |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert present - named == set(), "add these to the map in docs/concepts.md"
    assert named - present == set(), "the map in docs/concepts.md names what does not exist"
    for where, what in rows:  # a one-folder row's modules are files of that folder
        folder = re.fullmatch(r"\s*`([a-z_]+)/`\s*", where)
        for module in re.findall(r"`([a-z_]+\.py)`", what) if folder else []:
            assert (package / folder.group(1) / module).is_file(), f"{folder.group(1)}/{module}"


def test_changelog_follows_keep_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "Keep a Changelog" in text and "## [Unreleased]" in text


def _public_objects():
    import inspect

    import lightning_halo
    import lightning_halo.models
    import lightning_halo.quant

    seen = {}
    for mod in (lightning_halo, lightning_halo.models, lightning_halo.quant):
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                seen[f"{mod.__name__}.{name}"] = obj
    return seen


def test_every_public_name_has_a_docstring_with_args_and_example() -> None:
    import inspect

    missing = []
    for qualname, obj in _public_objects().items():
        doc = inspect.getdoc(obj) or ""
        if not doc:
            missing.append(f"{qualname}: no docstring")
            continue
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue  # exceptions: the docstring says when they are raised
        if "Example" not in doc:
            missing.append(f"{qualname}: no example")
        target = obj.__init__ if inspect.isclass(obj) else obj
        try:
            params = [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
        except (TypeError, ValueError):
            params = []
        if params and "Args:" not in doc and not (inspect.isclass(obj) and "Args:" in (inspect.getdoc(obj.__init__) or "")):
            missing.append(f"{qualname}: parameters {params} but no Args section")
    assert not missing, "\n".join(missing)


def test_docs_build_strict_and_render_docstring_markup(tmp_path: Path) -> None:
    import shutil

    mkdocs = shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    result = subprocess.run([mkdocs, "build", "--strict", "-d", str(site)], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    api = (site / "api" / "index.html").read_text()
    assert "lightning_halo.HaloQuantStrategy" in api and "<math" in api, "the API page documents the package, math as MathML"
    assert raw_markup(api) == [], "raw reStructuredText/TeX on the API page"
    assert defaults_said_twice(api) == [], "the signature's default is listed already"
    for page in site.rglob("*.html"):
        assert not re.findall(r'class="arithmatex"', page.read_text()), f"{page}: TeX left for a script that is not there"


@pytest.mark.parametrize("anchor, builds", [("#usage", True), ("#no-such-heading", False)])
def test_docs_build_fails_on_a_broken_anchor(anchor: str, builds: bool, tmp_path: Path) -> None:
    """mkdocs.yml's own strict and validation settings, on a two-page site: a link to a missing heading fails."""
    import shutil

    import yaml

    mkdocs = shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs not installed (pip install -e '.[docs]')")
    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config = {"site_name": "probe", "strict": ours["strict"], "validation": ours["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# Home\n\nSee [usage](other.md{anchor}).\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Usage\n\nText.\n")
    result = subprocess.run([mkdocs, "build", "-d", str(tmp_path / "site")], cwd=tmp_path, capture_output=True,
                            text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert (result.returncode == 0) == builds, result.stdout + result.stderr
    if not builds:
        assert "does not contain an anchor '#no-such-heading'" in result.stderr


def defaults_said_twice(page_html: str) -> list[str]:
    """The parameters of a rendered API page whose entry says ``default:`` more than once."""
    import html

    items = re.findall(r'<li[^>]*class="doc-section-item[^"]*"[^>]*>(.*?)</li>', page_html, re.S)
    texts = [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", item)).split()) for item in items]
    assert texts, "no parameter list found: has the page's markup changed?"
    return [text for text in texts if text.count("default:") > 1]


def raw_markup(page_html: str) -> list[str]:
    """Snippets of a rendered page's text that still show reStructuredText roles, links or TeX delimiters."""
    import html

    text = re.sub(r"<(script|style|pre)\b.*?</\1>", " ", page_html, flags=re.S)
    leftovers = re.findall(r"<autoref\b[^>]*>", text)
    text = html.unescape(re.sub(r"<[^>]+>", "", text))
    patterns = (
        r":(?:py:)?(?:class|func|meth|attr|mod|data|obj|exc|const|math):\S*",  # :class:`x` and friends
        r"\S*<https?://[^>\s]+>`?_+",  # `text <url>`_
        r"\S*`_+\b",
        r"\.\. [a-z-]+::",  # directives (.. math::, .. code-block::)
        r"\\[(\[]",  # TeX delimiters \( \[
    )
    return leftovers + [m for pattern in patterns for m in re.findall(pattern, text)]


def test_raw_markup_finds_what_it_should() -> None:
    page = '<p>Every :class:<code>~x.Y</code> (<code>Sylvie &lt;https://arxiv.org/abs/1&gt;</code>_) \\(x\\)</p><pre>a :class:</pre>'
    assert len(raw_markup(page)) == 3
    assert raw_markup("<p>Every <code>Y</code> (<a href='u'>Sylvie</a>) <math><mi>x</mi></math></p>") == []


#: A development machine's own directories: code finds its files relative to the checkout or through an
#: environment variable (benchmarks/shared.py), never at one machine's absolute path.
MACHINE_PATHS = re.compile(r"(?<![\w.~$-])/(?:work|root|home|Users)/")


def machine_paths(text: str) -> list[str]:
    """The lines of ``text`` that name an absolute path of one machine."""
    return [line.strip() for line in text.splitlines() if MACHINE_PATHS.search(line)]


def test_machine_paths_finds_what_it_should() -> None:
    found = machine_paths("\n".join(f'x = Path("/{top}/me/datasets")' for top in ("work", "home", "root", "Users")))
    assert len(found) == 4
    assert not machine_paths('a = ROOT.parent / "shared"\nb = "../shared/datasets"\nc = "~/work/x"\nd = "$HOME/x"\ne = "x/home/y"')


def test_no_path_of_one_machine_in_code() -> None:
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.yaml", "*.yml", "*.toml", "*.cfg"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert files, "git ls-files listed nothing"
    hits = [f"{name}: {line}" for name in files if (ROOT / name).is_file() for line in machine_paths((ROOT / name).read_text())]
    assert not hits, "absolute paths of a development machine (use ../shared or an environment variable):\n" + "\n".join(hits)
