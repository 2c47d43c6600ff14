"""The reply parser: one fenced block -> one command, everything else a format or usage error."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxswe.agent.commands import Command, FormatError, UsageError, extract_blocks, parse_action


def reply(body: str, reasoning: str = "Thinking about it.", tag: str = "") -> str:
    return f"{reasoning}\n```{tag}\n{body}\n```\n"


def test_shell_command_with_language_tag():
    cmd = parse_action(reply("ls -la src | head", tag="bash"))
    assert cmd == Command("shell", raw="ls -la src | head")


def test_multiline_shell_is_one_command():
    cmd = parse_action(reply("cd src\npython -c 'print(1)'"))
    assert cmd.name == "shell" and cmd.raw == "cd src\npython -c 'print(1)'"


def test_no_block_and_many_blocks_are_format_errors():
    assert parse_action("I think the bug is in foo.") == FormatError("no_command")
    two = reply("ls") + reply("pwd")
    assert parse_action(two) == FormatError("multiple_commands", num_blocks=2)
    assert parse_action("text\n```\nls\n") == FormatError("unclosed_block", num_blocks=1)
    assert parse_action("text\n```\n  \n```") == FormatError("empty_command", num_blocks=1)


def test_inline_code_is_not_a_block():
    assert parse_action("run `ls` and ``pwd``") == FormatError("no_command")


def test_four_backtick_fence_can_hold_triple_backticks():
    text = "Edit the README.\n````\nedit --file README.md 1:1\n```python\nx = 1\n```\n````"
    cmd = parse_action(text)
    assert cmd.name == "edit" and cmd.lines == ("```python", "x = 1", "```")


def test_open_goto_scroll_search_submit():
    assert parse_action(reply("open src/a.py 12")) == Command(
        "open", raw="open src/a.py 12", path="src/a.py", line=12
    )
    assert parse_action(reply("open")).path is None
    assert parse_action(reply("goto 7")).line == 7
    assert parse_action(reply("scroll_down")).name == "scroll_down"
    assert parse_action(reply("scroll_up")).name == "scroll_up"
    s = parse_action(reply('search_file "def foo(" lib/x.py'))
    assert (s.term, s.path) == ("def foo(", "lib/x.py")
    assert parse_action(reply("submit")).name == "submit"


def test_usage_errors_name_the_problem():
    for body, needle in [
        ("goto", "exactly one LINE"),
        ("goto x", "positive integer"),
        ("open a.py 0", "positive integer"),
        ("submit now", "no arguments"),
        ("scroll_down 3", "no arguments"),
        ("edit 5", "START:END"),
        ("edit 5:3", "bad range"),
        ("edit 2:3 << 'EOF'\nx", "not found"),
        ("edit 2:3 << 'EOF'\nx\nEOF\ny", "after the heredoc"),
        ("replace\nfoo", "SEARCH"),
        ("replace\n<<<<<<< SEARCH\na\n=======\nb", "unterminated"),
        ("search_file", "TERM"),
        ("open 'unclosed", "cannot split"),
    ]:
        out = parse_action(reply(body))
        assert isinstance(out, UsageError), body
        assert needle in out.message, (body, out.message)


def test_edit_inline_keeps_exact_indentation():
    cmd = parse_action(reply("edit 3:4\n    if x:\n\treturn  1\n"))
    assert (cmd.start, cmd.end, cmd.path) == (3, 4, None)
    assert cmd.lines == ("    if x:", "\treturn  1")


def test_edit_heredoc_with_file_and_blank_lines():
    cmd = parse_action(reply("edit --file pkg/m.py 10:9 << 'EOF'\n\n  def f():\n      pass\n\nEOF"))
    assert (cmd.path, cmd.start, cmd.end) == ("pkg/m.py", 10, 9)
    assert cmd.lines == ("", "  def f():", "      pass", "")


def test_edit_empty_heredoc_deletes():
    cmd = parse_action(reply('edit 2:5 <<"END"\nEND'))
    assert cmd.lines == ()


def test_create_with_and_without_content():
    assert parse_action(reply("create new.py")).lines == ()
    cmd = parse_action(reply("create pkg/new.py <<EOF\nx = 1\nEOF"))
    assert (cmd.path, cmd.lines) == ("pkg/new.py", ("x = 1",))


def test_replace_blocks_and_flags():
    body = (
        "replace --file a.py --replace-all\n<<<<<<< SEARCH\n    a = 1\n=======\n    a = 2\n>>>>>>> REPLACE\n"
        "<<<<<<< SEARCH\nb\n=======\n>>>>>>> REPLACE"
    )
    cmd = parse_action(reply(body))
    assert cmd.path == "a.py" and cmd.replace_all
    assert cmd.pairs == ((("    a = 1",), ("    a = 2",)), (("b",), ()))


def test_shell_command_starting_like_a_special_one():
    assert parse_action(reply("openssl version")).name == "shell"
    assert parse_action(reply("submitter --help")).name == "shell"


def test_crlf_replies_parse_like_lf():
    assert parse_action("Look.\r\n```bash\r\nls -a\r\n```\r\n") == Command("shell", raw="ls -a")


def test_extract_blocks_reports_unclosed():
    assert extract_blocks("a\n```\nx\n```\nb") == (["x"], False)
    assert extract_blocks("```sh\nx") == (["x"], True)


_pieces = st.sampled_from(
    [
        "```", "````", "```bash", "\n", " ", "edit", "open", "goto", "create", "replace", "submit",
        "search_file", "scroll_up", "<<", "'EOF'", "EOF", "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE",
        "--file", "--replace-all", "1:2", "3:1", "0", "-5", "x.py", '"', "'", "\\", "\t", "ls", "é", "\x00",
        "\r\n", "`",
    ]
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200), st.lists(st.one_of(_pieces, st.text(max_size=8)), max_size=40).map("".join)
    )
)
def test_parser_never_raises_on_fuzzed_replies(text):
    out = parse_action(text)
    assert isinstance(out, Command | UsageError | FormatError)
    if isinstance(out, Command):
        assert out.name in ("shell", "open", "goto", "scroll_up", "scroll_down", "create", "edit", "replace",
                            "search_file", "submit")  # fmt: skip
