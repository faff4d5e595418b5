"""The shell task family: small, procedurally generated file-system and text-processing jobs, in the spirit of
terminal-bench, for a sandboxed tool environment (`tool_sandbox.py` plays them, `sandbox_tasks.SandboxTask` is their
form).

Every task starts from a handful of small text files (at most 12, each under 4 KB), asks for one concrete end state
in a short instruction that names every path involved, and comes with a one-command expert solution that uses only
bash, coreutils, grep, sed, awk and find, plus a hidden Python check that asserts the exact end state. The check
fails on the untouched starting files and passes once the expert command has run.

Kinds (answers go to `answer.txt`; "stripped" means compared after `.strip()`, line by line for lists):

    kind              the task asks for                                  the check passes when
    ----------------  -------------------------------------------------  ---------------------------------------------
    count-lines       lines of a log file: all, those with a level        answer.txt, stripped, is that number
                      (ERROR, ...) or those without it
    count-files       files under a folder (subfolders too) with an       answer.txt, stripped, is that number
                      extension, or containing a word
    find-file         the path of the one file of a nested tree holding   answer.txt, stripped and normalized (a
                      a code, or with a given extension                   leading ./ is fine), is that path
    rename-ext        every .old file of a folder renamed to .new         the folder lists exactly the expected files,
                                                                          contents kept; a .old file elsewhere stays
    extract-column    a CSV column without the header, or one column of   the stripped lines of answer.txt are those
                      the rows where another column has a value           values, in file order
    aggregate-column  the sum, maximum or minimum of a numeric CSV        answer.txt, stripped, is that integer
                      column (header skipped)
    fix-config        one wrong value of a key=value, INI or YAML-like    every line of the file is as expected (only
                      config set to the value the instruction gives       that value changed); a sibling config too
    sort-dedupe       a list's distinct entries sorted, their number, or  the stripped lines of answer.txt are the
                      its most frequent entry                             expected ones
    replace-text      a product name replaced by its new name in the .md  every file of the folder has the expected
                      files of a folder and nowhere else                  lines (the .txt file keeps the old name)
    organize-files    the files of two extensions moved into two new      the folder and both subfolders list exactly
                      subfolders, the other files left in place           the expected files, contents kept

How tasks are drawn: everything comes from one `random.Random(f"shell-tasks/{seed}")`. Its first draw picks a kind
uniformly from `SHELL_KINDS`; when `kind` is given it replaces that pick, and the rest of the stream builds the task
(file names from small word lists, counts, values, which line is wrong, ...). So the same `(seed, kind)` always
gives an equal task, `shell_task(seed)` equals `shell_task(seed, shell_task(seed).kind)`, and different seeds give
different files and answers.

Example:
    >>> task = shell_task(0)
    >>> task.kind in SHELL_KINDS
    True
    >>> task == shell_task(0) == shell_task(0, task.kind)
    True
    >>> task = shell_task(7, "count-lines")
    >>> [call["name"] for call in task.solution]
    ['bash', 'submit']
    >>> "answer.txt" in task.instruction and "answer.txt" in task.check
    True
"""

from __future__ import annotations

import random
from collections.abc import Callable

from trl_agents.envs.sandbox_tasks import SandboxTask, bash, submit

SHELL_KINDS: tuple[str, ...] = (
    "count-lines",
    "count-files",
    "find-file",
    "rename-ext",
    "extract-column",
    "aggregate-column",
    "fix-config",
    "sort-dedupe",
    "replace-text",
    "organize-files",
)

# Lowercase words, none a substring of another (a `grep word` never matches a longer word by accident).
_WORDS = (
    "amber", "anchor", "apple", "birch", "breeze", "canyon", "cedar", "cloud", "cobalt", "comet", "coral", "delta",
    "ember", "falcon", "fern", "forest", "garnet", "glacier", "harbor", "hazel", "island", "jasper", "juniper",
    "lagoon", "lantern", "lemon", "maple", "meadow", "nectar", "onyx", "orchid", "pebble", "pepper", "quartz",
    "raven", "river", "saffron", "summit", "thistle", "tiger", "tulip", "valley", "violet", "willow", "zephyr",
)  # fmt: skip
_PEOPLE = (
    "alice", "bruno", "carla", "dmitri", "elena", "farid", "grace", "hiro", "ines", "jonas", "kemal", "lena",
    "mateo", "nadia", "oscar", "priya", "quinn", "rosa", "sami", "tomas", "uma", "viktor", "wen", "yara", "zane",
)  # fmt: skip
_CITIES = ("Lima", "Oslo", "Cairo", "Quito", "Dakar", "Hanoi")
_SERVICES = ("web", "api", "worker", "backup", "mailer", "scheduler", "auth", "billing", "search", "gateway")
# Capitalized product names, none a substring of another or of a lowercase word.
_PRODUCTS = (
    "Acme", "Globex", "Initech", "Hooli", "Vandelay", "Wonka", "Cyberdyne", "Tyrell", "Soylent", "Umbrella",
    "Nakatomi", "Oscorp", "Aperture", "Massive", "Pendant",
)  # fmt: skip
_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")

_Builder = Callable[[random.Random], SandboxTask]


def shell_task(seed: int, kind: str | None = None) -> SandboxTask:
    """Draw the shell task of `seed`: a `SandboxTask` whose files, instruction, expert solution and check all come
    from `random.Random(f"shell-tasks/{seed}")`.

    Args:
        seed: Any integer; equal seeds (and kinds) give equal tasks.
        kind: One of `SHELL_KINDS`, or `None` to let the seed pick one uniformly.

    Returns:
        The task. Its `solution` is one `bash` call and `submit`; its `check` exits 0 exactly when the expected end
        state is there.

    Raises:
        ValueError: If `kind` is not one of `SHELL_KINDS`.
    """
    if kind is not None and kind not in _BUILDERS:
        raise ValueError(f"unknown shell task kind {kind!r}; expected one of {', '.join(SHELL_KINDS)}")
    rng = random.Random(f"shell-tasks/{seed}")
    drawn = rng.choice(SHELL_KINDS)  # always drawn, so a given kind leaves the rest of the stream unchanged
    return _BUILDERS[kind or drawn](rng)


# ----------------------------------------------------------------------------------------------------------------
# Shared pieces: file text, checks, the task itself


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _prose(rng: random.Random, count: int, words: tuple[str, ...] | list[str] = _WORDS) -> list[str]:
    """`count` lines of 3-6 random words."""
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 6))) for _ in range(count)]


def _folders(rng: random.Random, root: str) -> list[str]:
    """A small nested tree under `root`: the root, two subfolders and one sub-subfolder."""
    first, second, third = rng.sample(_WORDS, 3)
    return [root, f"{root}/{first}", f"{root}/{second}", f"{root}/{first}/{third}"]


def _task(kind: str, instruction: str, files: dict[str, str], command: str, check: str, hint: str) -> SandboxTask:
    return SandboxTask(
        kind=kind, instruction=instruction, files=files, solution=(bash(command), submit()), check=check, hint=hint
    )


def _answer_check(expected: str) -> str:
    """A check that `answer.txt`, stripped, is `expected`."""
    return (
        "got = open('answer.txt', encoding='utf-8', errors='replace').read().strip()\n"
        f"assert got == {expected!r}, f'answer.txt holds {{got!r}}'\n"
    )


def _answer_lines_check(expected: list[str]) -> str:
    """A check that the stripped lines of `answer.txt` (surrounding blank lines dropped) are `expected`."""
    return (
        "text = open('answer.txt', encoding='utf-8', errors='replace').read().strip()\n"
        "got = [line.strip() for line in text.splitlines()]\n"
        f"assert got == {expected!r}, f'answer.txt holds {{got!r}}'\n"
    )


def _files_check(files: dict[str, str], listings: dict[str, list[str]] | None = None) -> str:
    """A check that each folder of `listings` holds exactly those names and each file of `files` has those lines
    (trailing spaces and a missing final newline are forgiven)."""
    expected = {path: [line.rstrip() for line in text.splitlines()] for path, text in files.items()}
    check = ""
    if listings:
        listed = {folder: sorted(names) for folder, names in listings.items()}
        check += (
            "import os\n"
            f"for folder, names in {listed!r}.items():\n"
            "    found = sorted(os.listdir(folder))\n"
            "    assert found == names, f'{folder} holds {found}'\n"
        )
    return check + (
        f"for path, lines in {expected!r}.items():\n"
        "    with open(path, encoding='utf-8', errors='replace') as handle:\n"
        "        got = [line.rstrip() for line in handle.read().splitlines()]\n"
        "    assert got == lines, f'{path} is not as expected'\n"
    )


# ----------------------------------------------------------------------------------------------------------------
# One builder per kind


def _log_lines(rng: random.Random, count: int) -> list[str]:
    """`count` log lines `2024-05-DD HH:MM:SS LEVEL message` in time order, using at least three levels."""
    while True:
        levels = rng.choices(_LEVELS, weights=(5, 2, 2, 2), k=count)
        if len(set(levels)) >= 3:
            break
    day, seconds = rng.randint(1, 28), rng.randint(0, 40_000)
    lines = []
    for level in levels:
        seconds += rng.randint(1, 900)
        message = rng.choice(
            (
                f"user {rng.choice(_PEOPLE)} logged in",
                f"user {rng.choice(_PEOPLE)} logged out",
                f"GET /{rng.choice(_WORDS)} returned {rng.choice((200, 201, 304, 404, 500))}",
                f"job {rng.choice(_WORDS)} finished in {rng.randint(3, 4000)} ms",
                f"cache miss for key {rng.choice(_WORDS)}",
                f"connection to {rng.choice(_WORDS)}.internal lost",
                f"disk usage at {rng.randint(10, 99)}%",
            )
        )
        clock = f"{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        lines.append(f"2024-05-{day:02d} {clock} {level} {message}")
    return lines


def _count_lines(rng: random.Random) -> SandboxTask:
    folder = rng.choice(("logs", "var/log", "service/logs"))
    service, other = rng.sample(_SERVICES, 2)
    path = f"{folder}/{service}.log"
    lines = _log_lines(rng, rng.randint(12, 30))
    files = {path: _text(lines), f"{folder}/{other}.log": _text(_log_lines(rng, rng.randint(5, 12)))}
    level = rng.choice(sorted({line.split()[2] for line in lines}))
    variant = rng.choice(("all", "with", "without"))
    if variant == "all":
        count = len(lines)
        what = f"the number of lines in {path}"
        command = f"wc -l < {path} > answer.txt"
        hint = f"Count the lines with `wc -l < {path}` and write the number into answer.txt."
    elif variant == "with":
        count = sum(level in line for line in lines)
        what = f"the number of lines in {path} that contain {level}"
        command = f"grep -c {level} {path} > answer.txt"
        hint = f"Count the matching lines with `grep -c {level} {path}` and write the number into answer.txt."
    else:
        count = sum(level not in line for line in lines)
        what = f"the number of lines in {path} that do not contain {level}"
        command = f"grep -vc {level} {path} > answer.txt"
        hint = f"Count the non-matching lines with `grep -vc {level} {path}` and write the number into answer.txt."
    instruction = f"Write {what} into answer.txt, as a bare number."
    return _task("count-lines", instruction, files, command, _answer_check(str(count)), hint)


def _file_body(rng: random.Random, extension: str, words: tuple[str, ...] | list[str] = _WORDS) -> list[str]:
    """A few lines that look like a file of `extension`."""
    if extension == "csv":
        return ["name,count"] + [f"{rng.choice(words)},{rng.randint(1, 99)}" for _ in range(rng.randint(2, 5))]
    if extension == "json":
        return ["{" + f'"name": "{rng.choice(words)}", "size": {rng.randint(1, 99)}' + "}"]
    if extension == "py":
        return [f'print("{rng.choice(words)}")' for _ in range(rng.randint(1, 3))]
    return _prose(rng, rng.randint(2, 6), words)


def _count_files(rng: random.Random) -> SandboxTask:
    root = rng.choice(("data", "project", "archive", "shared", "workspace", "backup", "repo"))
    folders = _folders(rng, root)
    total = rng.randint(6, 10)
    hits = rng.randint(1, total - 2)
    flags = [True] * hits + [False] * (total - hits)
    rng.shuffle(flags)
    extensions = ("txt", "csv", "md", "log", "json", "py")
    names = iter(rng.sample(_WORDS, total + 1))
    files: dict[str, str] = {}
    if rng.random() < 0.5:
        target = rng.choice(extensions)
        others = [extension for extension in extensions if extension != target]
        for flag in flags:
            extension = target if flag else rng.choice(others)
            files[f"{rng.choice(folders)}/{next(names)}.{extension}"] = _text(_file_body(rng, extension))
        files[f"{next(names)}.{target}"] = _text(_file_body(rng, target))  # outside the folder: not counted
        question = f"How many files with a name ending in .{target} are under {root}/, subfolders included?"
        command = f"find {root} -type f -name '*.{target}' | wc -l > answer.txt"
        hint = f"List them with `find {root} -type f -name '*.{target}'` and count with `wc -l`."
    else:
        word = rng.choice(_WORDS)
        rest = [other for other in _WORDS if word not in other]
        for flag in flags:
            extension = rng.choice(("txt", "md", "log"))
            lines = _prose(rng, rng.randint(2, 6), rest)
            if flag:
                at = rng.randrange(len(lines))
                lines[at] = f"{lines[at]} {word}"
            files[f"{rng.choice(folders)}/{next(names)}.{extension}"] = _text(lines)
        files[f"{next(names)}.txt"] = _text(_prose(rng, 2, rest) + [f"{word} {rng.choice(rest)}"])  # not counted
        question = f"How many files under {root}/, subfolders included, contain the word {word}?"
        command = f"grep -rl {word} {root} | wc -l > answer.txt"
        hint = f"List the files that contain it with `grep -rl {word} {root}` and count them with `wc -l`."
    instruction = f"{question} Write the number into answer.txt, as a bare number."
    return _task("count-files", instruction, files, command, _answer_check(str(hits)), hint)


def _find_file(rng: random.Random) -> SandboxTask:
    root = rng.choice(("docs", "notes", "home", "projects", "library"))
    folders = _folders(rng, root)
    names = rng.sample(_WORDS, rng.randint(6, 10))
    target = rng.randrange(len(names))
    by_content = rng.random() < 0.5
    code = f"{rng.choice(_WORDS)}-{rng.randint(1000, 9999)}"
    unique = rng.choice(("key", "pem", "bak", "cfg", "ini"))
    files: dict[str, str] = {}
    for index, name in enumerate(names):
        lines = _prose(rng, rng.randint(2, 8))
        if by_content:
            extension = rng.choice(("txt", "md"))
            if index == target:
                lines.insert(rng.randint(0, len(lines)), f"the access code is {code}")
        else:
            extension = unique if index == target else rng.choice(("txt", "md", "log"))
        path = f"{rng.choice(folders)}/{name}.{extension}"
        files[path] = _text(lines)
        if index == target:
            answer = path
    if by_content:
        what = f"Exactly one file under {root}/ contains the text {code}."
        command = f"grep -rl {code} {root} > answer.txt"
        hint = f"Search the contents with `grep -rl {code} {root}` and write the path it prints into answer.txt."
    else:
        what = f"Exactly one file under {root}/ has a name ending in .{unique}."
        command = f"find {root} -name '*.{unique}' > answer.txt"
        hint = f"Search the names with `find {root} -name '*.{unique}'` and write the path it prints into answer.txt."
    instruction = f"{what} Write its path, relative to this directory (like {root}/a/b.txt), into answer.txt."
    check = (
        "import os\n"
        "got = open('answer.txt', encoding='utf-8', errors='replace').read().strip()\n"
        f"assert got and os.path.normpath(got) == {answer!r}, f'answer.txt holds {{got!r}}'\n"
    )
    return _task("find-file", instruction, files, command, check, hint)


def _rename_ext(rng: random.Random) -> SandboxTask:
    old, new = rng.choice(
        (("txt", "md"), ("jpeg", "jpg"), ("htm", "html"), ("yml", "yaml"), ("text", "txt"), ("markdown", "md"))
    )
    folder = rng.choice(("notes", "pages", "drafts", "site", "files", "posts", "media", "export"))
    keep_extension = rng.choice(("rst", "csv", "log", "json"))  # never one of the pairs' extensions
    renamed = rng.randint(3, 6)
    names = rng.sample(_WORDS, renamed + 3)
    files: dict[str, str] = {}
    after: dict[str, str] = {}
    for name in names[:renamed]:
        text = _text(_prose(rng, rng.randint(1, 5)))
        files[f"{folder}/{name}.{old}"] = text
        after[f"{folder}/{name}.{new}"] = text
    for name in names[renamed : renamed + rng.randint(1, 2)]:
        text = _text(_prose(rng, rng.randint(1, 4)))
        files[f"{folder}/{name}.{keep_extension}"] = after[f"{folder}/{name}.{keep_extension}"] = text
    outside = f"{names[-1]}.{old}"  # same extension, other folder: stays
    files[outside] = after[outside] = _text(_prose(rng, 2))
    instruction = (
        f"Rename every file in {folder}/ whose name ends in .{old} so that it ends in .{new} instead "
        f"({folder}/{names[0]}.{old} becomes {folder}/{names[0]}.{new}). Leave all other files as they are."
    )
    command = f'for f in {folder}/*.{old}; do mv "$f" "${{f%.{old}}}.{new}"; done'
    listing = [path.split("/", 1)[1] for path in after if path.startswith(f"{folder}/")]
    check = _files_check(after, {folder: listing})
    hint = f"Loop over {folder}/*.{old} and `mv` each file to the same name with .{new} (bash `${{f%.{old}}}`)."
    return _task("rename-ext", instruction, files, command, check, hint)


def _people_rows(rng: random.Random, columns: list[str], count: int) -> list[dict[str, str]]:
    rows = []
    for index in range(count):
        name = rng.choice(_PEOPLE)
        rows.append(
            {
                "id": str(index + 1),
                "name": name.capitalize(),
                "city": rng.choice(_CITIES),
                "age": str(rng.randint(19, 70)),
                "team": rng.choice(("red", "blue", "green", "gold")),
                "email": f"{name}{rng.randint(1, 99)}@example.com",
            }
        )
    return [{column: row[column] for column in columns} for row in rows]


def _extract_column(rng: random.Random) -> SandboxTask:
    path = f"{rng.choice(('data', 'exports', 'tables'))}/{rng.choice(('people', 'staff', 'members', 'users'))}.csv"
    columns = ["id"] + rng.sample(["name", "city", "age", "team", "email"], 5)
    rows = _people_rows(rng, columns, rng.randint(6, 15))
    files = {path: _text([",".join(columns)] + [",".join(row.values()) for row in rows])}
    if rng.random() < 0.5:
        column = rng.choice(columns[1:])
        values = [row[column] for row in rows]
        instruction = (
            f"Write the values of the {column} column of {path} (not the header) into answer.txt, one per line, "
            "in file order."
        )
        command = f"tail -n +2 {path} | cut -d, -f{columns.index(column) + 1} > answer.txt"
        hint = f"Skip the header with `tail -n +2` and cut field {columns.index(column) + 1} with `cut -d, -f`."
    else:
        key = rng.choice(("city", "team"))
        column = rng.choice(("name", "email", "age"))
        value = rng.choice(rows)[key]
        values = [row[column] for row in rows if row[key] == value]
        instruction = (
            f"For every row of {path} whose {key} is {value}, write its {column} into answer.txt, one per line, "
            "in file order."
        )
        where, field = columns.index(key) + 1, columns.index(column) + 1
        command = f"awk -F, '${where} == \"{value}\" {{print ${field}}}' {path} > answer.txt"
        hint = f"Filter and print with awk: `awk -F, '${where} == \"{value}\" {{print ${field}}}' {path}`."
    return _task("extract-column", instruction, files, command, _answer_lines_check(values), hint)


def _aggregate_column(rng: random.Random) -> SandboxTask:
    folder = rng.choice(("reports", "finance", "exports"))
    path = f"{folder}/{rng.choice(('sales', 'orders', 'shipments', 'invoices', 'returns'))}.csv"
    columns = ["date"] + rng.sample(["item", "region", "qty", "price", "stock"], 5)
    rows = []
    for _ in range(rng.randint(6, 15)):
        row = {
            "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "item": rng.choice(_WORDS),
            "region": rng.choice(("north", "south", "east", "west")),
            "qty": str(rng.randint(1, 60)),
            "price": str(rng.randint(1, 900)),
            "stock": str(rng.randint(0, 300)),
        }
        rows.append(",".join(row[column] for column in columns))
    files = {path: _text([",".join(columns)] + rows)}
    column = rng.choice(("qty", "price", "stock"))
    field = columns.index(column) + 1
    values = [int(row.split(",")[field - 1]) for row in rows]
    operation = rng.choice(("sum", "maximum", "minimum"))
    if operation == "sum":
        answer = sum(values)
        command = f"awk -F, 'NR>1 {{s+=${field}}} END {{print s}}' {path} > answer.txt"
        hint = f"Add up field {field} after the header with awk: `awk -F, 'NR>1 {{s+=${field}}} END {{print s}}'`."
    else:
        answer = max(values) if operation == "maximum" else min(values)
        end = "tail -1" if operation == "maximum" else "head -1"
        command = f"tail -n +2 {path} | cut -d, -f{field} | sort -n | {end} > answer.txt"
        hint = f"Cut field {field} without the header, sort it numerically and take the {operation} with `{end}`."
    instruction = (
        f"Write the {operation} of the {column} column of {path} (all rows, not the header) into answer.txt, "
        "as a bare number."
    )
    return _task("aggregate-column", instruction, files, command, _answer_check(str(answer)), hint)


# Config keys and how a value is drawn; `cache_dir` holds a slash, so it is never the key to fix (sed uses `/`).
_CONFIG_VALUES: dict[str, Callable[[random.Random, str], str]] = {
    "port": lambda rng, service: str(rng.randint(1024, 9999)),
    "host": lambda rng, service: f"{rng.choice(_WORDS)}.internal",
    "workers": lambda rng, service: str(rng.randint(1, 16)),
    "timeout": lambda rng, service: str(rng.randint(5, 120)),
    "log_level": lambda rng, service: rng.choice(("debug", "info", "warning", "error")),
    "max_connections": lambda rng, service: str(rng.randint(10, 500)),
    "retries": lambda rng, service: str(rng.randint(0, 9)),
    "cache_dir": lambda rng, service: f"/var/cache/{service}",
    "user": lambda rng, service: rng.choice(_PEOPLE),
    "enabled": lambda rng, service: rng.choice(("true", "false")),
    "db_name": lambda rng, service: f"{service}_{rng.choice(_WORDS)}",
}


def _config_text(rng: random.Random, service: str, style: str, values: dict[str, str]) -> str:
    """A config file of `values` in `style` ("conf": `k=v`, "ini": sections of `k = v`, "yaml": `k: v`)."""
    if style == "ini":
        keys = list(values)
        cut = rng.randint(1, len(keys) - 1)
        first, second = rng.sample(("server", "database", "logging", "runtime"), 2)
        lines = [f"; {service} configuration", f"[{first}]"] + [f"{key} = {values[key]}" for key in keys[:cut]]
        lines += ["", f"[{second}]"] + [f"{key} = {values[key]}" for key in keys[cut:]]
    else:
        separator = "=" if style == "conf" else ": "
        lines = [f"# {service} settings"] + [f"{key}{separator}{value}" for key, value in values.items()]
    return _text(lines)


def _fix_config(rng: random.Random) -> SandboxTask:
    service, other = rng.sample(_SERVICES, 2)
    style = rng.choice(("conf", "ini", "yaml"))
    folder = rng.choice(("config", "etc", "settings"))
    path, other_path = f"{folder}/{service}.{style}", f"{folder}/{other}.{style}"
    keys = rng.sample(list(_CONFIG_VALUES), rng.randint(5, 8))
    values = {key: _CONFIG_VALUES[key](rng, service) for key in keys}
    key = rng.choice([key for key in keys if key != "cache_dir"])
    wrong = values[key]
    while wrong == values[key]:
        wrong = _CONFIG_VALUES[key](rng, service)
    separator = {"conf": "=", "ini": " = ", "yaml": ": "}[style]
    fixed = _config_text(rng, service, style, values)
    # Every key line follows a newline (the first line is a comment) and keys are distinct: one line changes.
    broken = fixed.replace(f"\n{key}{separator}{values[key]}\n", f"\n{key}{separator}{wrong}\n")
    other_values = {name: _CONFIG_VALUES[name](rng, other) for name in rng.sample(list(_CONFIG_VALUES), 5)}
    other_text = _config_text(rng, other, style, other_values)
    files = {path: broken, other_path: other_text}
    instruction = (
        f"The {service} service fails to start because {key} in {path} is {wrong}; it must be {values[key]}. "
        "Change that value and leave everything else in the file unchanged."
    )
    command = f"sed -i 's/^{key}{separator}.*/{key}{separator}{values[key]}/' {path}"
    hint = f"Rewrite only the {key} line, in place, with `{command}`."
    check = _files_check({path: fixed, other_path: other_text})
    return _task("fix-config", instruction, files, command, check, hint)


def _sort_dedupe(rng: random.Random) -> SandboxTask:
    folder = rng.choice(("lists", "data", "inbox", "records"))
    name = rng.choice(("guests", "tags", "visitors", "signups", "votes", "attendees", "requests", "keywords"))
    path = f"{folder}/{name}.txt"
    pool = rng.sample(rng.choice((_WORDS, _PEOPLE)), rng.randint(4, 8))
    counts = [rng.randint(1, 5) for _ in pool]
    variant = rng.choice(("sorted", "distinct", "top"))
    if variant == "top":
        winner = counts.index(max(counts))
        counts[winner] = max(counts) + 1  # a single most frequent line
    elif max(counts) == 1:
        counts[0] = 2  # at least one duplicate
    lines = [item for item, count in zip(pool, counts, strict=True) for _ in range(count)]
    rng.shuffle(lines)
    files = {path: _text(lines)}
    if variant == "sorted":
        what = "each distinct entry once, sorted alphabetically, one per line"
        expected = sorted(pool)
        command = f"sort -u {path} > answer.txt"
        hint = f"Sort and drop duplicates with `sort -u {path}`."
    elif variant == "distinct":
        what, expected = "the number of distinct entries, as a bare number", [str(len(pool))]
        command = f"sort -u {path} | wc -l > answer.txt"
        hint = f"Count the distinct lines with `sort -u {path} | wc -l`."
    else:
        what, expected = "the entry that occurs most often (just the entry itself)", [pool[winner]]
        command = f"sort {path} | uniq -c | sort -rn | head -1 | awk '{{print $2}}' > answer.txt"
        hint = "Count each line with `sort | uniq -c`, sort the counts with `sort -rn` and keep the top line's text."
    instruction = f"{path} has one entry per line, with repeats. Write into answer.txt {what}."
    return _task("sort-dedupe", instruction, files, command, _answer_lines_check(expected), hint)


def _replace_text(rng: random.Random) -> SandboxTask:
    old, new = rng.sample(_PRODUCTS, 2)
    folder = rng.choice(("docs", "manual", "site", "guide"))
    names = rng.sample(_WORDS, rng.randint(3, 5))
    templates = (
        "Welcome to {p}, the {a} {b} tool.",
        "Install {p} before the {a} step.",
        "See the {p} {a} page for details.",
        "{p} keeps your {a} and {b} in sync.",
    )
    files: dict[str, str] = {}
    for index, name in enumerate(names):
        lines = _prose(rng, rng.randint(2, 6))
        for _ in range(rng.randint(1 if index < 2 else 0, 3)):  # the first two pages mention the old name
            line = rng.choice(templates).format(p=old, a=rng.choice(_WORDS), b=rng.choice(_WORDS))
            lines.insert(rng.randint(0, len(lines)), line)
        files[f"{folder}/{name}.md"] = _text(lines)
    legacy = f"{folder}/{rng.choice(('history', 'legacy', 'changelog'))}.txt"
    files[legacy] = _text([f"Version 1 of {old} was released.", f"{old} {rng.choice(_WORDS)} notes."])
    expected = {path: text if path == legacy else text.replace(old, new) for path, text in files.items()}
    instruction = (
        f"The product {old} was renamed to {new}. Replace every {old} with {new} in the .md files of {folder}/. "
        "Do not change any other file."
    )
    command = f"sed -i 's/{old}/{new}/g' {folder}/*.md"
    hint = f"Substitute in place in the .md files only: `sed -i 's/{old}/{new}/g' {folder}/*.md`."
    return _task("replace-text", instruction, files, command, _files_check(expected), hint)


def _organize_files(rng: random.Random) -> SandboxTask:
    folder = rng.choice(("inbox", "downloads", "uploads", "scans"))
    targets = rng.sample(
        [("jpg", "images"), ("png", "pictures"), ("pdf", "documents"), ("mp3", "music"), ("zip", "archives")], 2
    )
    names = iter(rng.sample(_WORDS, 12))
    files: dict[str, str] = {}
    after: dict[str, str] = {}
    listings: dict[str, list[str]] = {folder: [subfolder for _, subfolder in targets]}
    for extension, subfolder in targets:
        listings[f"{folder}/{subfolder}"] = []
        for _ in range(rng.randint(2, 4)):
            name = f"{next(names)}.{extension}"
            text = f"{extension} data {rng.randint(1, 999)}\n"
            files[f"{folder}/{name}"] = after[f"{folder}/{subfolder}/{name}"] = text
            listings[f"{folder}/{subfolder}"].append(name)
    for _ in range(rng.randint(1, 2)):
        name = f"{next(names)}.{rng.choice(('txt', 'md', 'log'))}"
        files[f"{folder}/{name}"] = after[f"{folder}/{name}"] = _text(_prose(rng, 2))
        listings[folder].append(name)
    (first, first_folder), (second, second_folder) = targets
    instruction = (
        f"In {folder}/, move every .{first} file into {folder}/{first_folder}/ and every .{second} file into "
        f"{folder}/{second_folder}/ (create these folders). Leave the other files where they are."
    )
    command = (
        f"cd {folder} && mkdir -p {first_folder} {second_folder} && mv *.{first} {first_folder}/ "
        f"&& mv *.{second} {second_folder}/"
    )
    hint = f"`mkdir -p` the two folders inside {folder}/, then `mv *.{first}` and `mv *.{second}` into them."
    return _task("organize-files", instruction, files, command, _files_check(after, listings), hint)


_BUILDERS: dict[str, _Builder] = {
    "count-lines": _count_lines,
    "count-files": _count_files,
    "find-file": _find_file,
    "rename-ext": _rename_ext,
    "extract-column": _extract_column,
    "aggregate-column": _aggregate_column,
    "fix-config": _fix_config,
    "sort-dedupe": _sort_dedupe,
    "replace-text": _replace_text,
    "organize-files": _organize_files,
}
assert tuple(_BUILDERS) == SHELL_KINDS
