"""attnlab chat RUN|HF_FOLDER|GGUF [--system TEXT] [--tools calculator] [-n/--max-new-tokens N
--temperature T --top-k K --top-p P --seed S] [--device D]

A conversation in the terminal, as `ollama run` holds one: the reply streams as it is generated,
the whole history is the next prompt (rendered by the model's chat template: a chat run's, a
Hugging Face folder's, a GGUF file's). `/reset` forgets the history, `/save FILE` writes it as one
line of OpenAI's fine-tuning JSONL (what `task = "chat"` trains on), Ctrl-C stops a reply and
keeps what was said, Ctrl-D or `/bye` leaves. With `--tools calculator`, a reply that ends its turn on
a calculator call is answered by the calculator and goes on (`attnlab.decode.tool_use`); the call
and its answer show as a dim line, `[calculator] 347*12 = 4164`."""

import argparse
import json
import sys
from pathlib import Path

from attnlab.cli import non_negative_int, positive_int
from attnlab.cli.arguments import add_device_argument, add_seed_argument
from attnlab.errors import UserError
from attnlab.families import CAUSAL_LM
from attnlab.sources import takes_words

TOOL_NAMES = ("calculator",)
"""The tools `--tools` takes: `attnlab.decode.tool_use.TOOLS`'s names, here without importing PyTorch."""
DIM, PLAIN = "\x1b[2m", "\x1b[0m"
HELP = "/reset forgets the conversation, /save FILE writes it as JSONL, /bye or Ctrl-D leaves, Ctrl-C stops a reply"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat",
        help="talk to a chat model in the terminal",
        description="A conversation with a model that has a chat template (a run trained with task chat, "
        f"or a chat model's folder or GGUF file): streaming replies and history. {HELP}.",
    )
    p.add_argument("run_dir", metavar="MODEL", help=takes_words((CAUSAL_LM,)) + " with a chat template")
    p.add_argument("--system", metavar="TEXT", help="a system prompt, the first message of every conversation")
    add_tools_argument(
        p, "tools the model may call while it replies, answered here and the reply continued (off by default)"
    )
    p.add_argument(
        "-n", "--max-new-tokens", type=non_negative_int, default=512, help="the longest reply in tokens (default 512)"
    )
    p.add_argument("--temperature", type=float, default=0.7, help="softmax temperature; 0 = greedy (default 0.7)")
    p.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with probability >= p")
    add_seed_argument(p)
    add_device_argument(p)
    p.set_defaults(run=run, check=check)


def add_tools_argument(p: argparse.ArgumentParser, help: str) -> None:
    names = ", ".join(TOOL_NAMES)
    p.add_argument("--tools", type=tool_list, default=(), metavar="NAME[,NAME]", help=f"{help}: {names}")


def tool_list(text: str) -> tuple[str, ...]:
    """The tools named in "calculator" or "a,b"; an argparse error naming the tools there are."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in TOOL_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"no tool {(unknown or [text])[0]!r}; the tools are {', '.join(TOOL_NAMES)}")
    return names


def check(args: argparse.Namespace) -> None:
    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")


def run(args: argparse.Namespace) -> int:
    from attnlab.chat import Chat
    from attnlab.device import resolve_device
    from attnlab.train.load import load_any

    device = resolve_device(args.device)
    loaded = load_any(args.run_dir, command="chat", device=device)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    options = dict(system=args.system, tools=args.tools, max_new_tokens=args.max_new_tokens, **sampling)
    chat = Chat(loaded, template=chat_template(Path(args.run_dir), loaded), **options)
    sys.stdout.write(f"{HELP}.\n")
    ChatSession(chat).loop()
    return 0


def chat_template(path: str | Path, loaded):
    """The model's `ChatTemplate` (`attnlab.tasks.chat.loaded_chat_template`). `loaded`: `load_any`'s."""
    from attnlab.tasks.chat import loaded_chat_template

    return loaded_chat_template(path, loaded)


class ChatSession:
    """One conversation in the terminal: an `attnlab.Chat` (the history, OpenAI's chat messages,
    and the tools it may call), a reply streamed to stdout for each user line."""

    def __init__(self, chat) -> None:
        self.chat = chat

    def loop(self) -> None:
        """Read lines until Ctrl-D or /bye; Ctrl-C at the prompt says how to leave."""
        while True:
            try:
                line = input(">>> ")
            except EOFError:
                sys.stdout.write("\n")
                return
            except KeyboardInterrupt:
                sys.stdout.write("\nUse Ctrl-D or /bye to leave.\n")
                continue
            if not self.command(line.strip()):
                return

    def command(self, line: str) -> bool:
        """Act on one line; False to leave."""
        if line in ("/bye", "/exit"):
            return False
        if line == "/reset":
            self.chat.reset()
            sys.stdout.write("(the conversation is forgotten)\n")
        elif line.startswith("/save"):
            self.save(line[len("/save") :].strip())
        elif line.startswith("/"):
            sys.stdout.write(f"unknown command {line.split()[0]!r}; {HELP}\n")
        elif line:
            self.reply(line)
        return True

    def save(self, name: str) -> None:
        if not name:
            sys.stdout.write("/save needs a file name: /save FILE.jsonl\n")
            return
        try:
            Path(name).write_text(
                json.dumps({"messages": self.chat.messages}, ensure_ascii=False) + "\n", encoding="utf-8"
            )
        except OSError as e:
            sys.stdout.write(f"cannot write {name}: {e.strerror}\n")
            return
        sys.stdout.write(f"(saved {len(self.chat.messages)} messages to {name})\n")

    def reply(self, text: str) -> None:
        """Stream the model's answer to `text`, its tools' calls answered; Ctrl-C stops it, keeping
        what was said."""
        from attnlab.chat import ConversationTooLong
        from attnlab.decode.tool_use import ToolResult

        items = self.chat.stream(text)
        at_start = True  # of a line
        try:
            for item in items:
                if isinstance(item, ToolResult):
                    self.show(item, at_start)
                    at_start = True
                    continue
                sys.stdout.write(item)
                sys.stdout.flush()
                at_start = item.endswith("\n")
        except ConversationTooLong as e:
            sys.stdout.write(f"(the conversation is {e.tokens} tokens, past the context of {e.context}; /reset)\n")
            return
        except KeyboardInterrupt:
            items.close()  # the reply so far joins the history
            sys.stdout.write(" (stopped)")
        sys.stdout.write("\n")

    def show(self, result, at_start: bool) -> None:
        """A call and its answer on a line of their own, dim on a terminal."""
        dim, plain = (DIM, PLAIN) if sys.stdout.isatty() else ("", "")
        lead = "" if at_start else "\n"
        sys.stdout.write(f"{lead}{dim}[{result.name}] {result.summary()}{plain}\n")
        sys.stdout.flush()
