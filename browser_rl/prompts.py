"""What the policy reads: the system prompt, each turn's user message (what became of the last action, the page,
the goal), and their rendering into token ids with the model's own chat template.

The page is BrowserGym's accessibility tree, compacted (`compact_page`) and cut at `max_page_chars`. Nothing
here talks to a server or a model: rollout.py hands the observations in and appends the tokens that come out.
"""

import re

from web_env.actions import describe_actions
from web_env.models import BrowserGymObservation

# The version of what this module writes around the page: a model trained on one version is played with it
# (browser_rl.episode_settings). Raise it whenever the system prompt, the messages or the page's compaction change.
PROMPT_VERSION = 2

# The observation's fields the messages read: at reset a server is asked for these alone.
PROMPT_FIELDS = ["goal", "axtree_txt", "error"]

INSTRUCTIONS = (
    "You control a web browser to complete a task. Each turn you get the page as an accessibility tree, "
    "where [N] is the id (bid) of an element. Reply with exactly one action."
)
SYSTEM_PROMPT = INSTRUCTIONS + "\n\n" + describe_actions()  # with the action reference (the default episode setting)

# An InlineTextBox line repeats the text of the element above it, and a url property names the server's copy of
# the page (a file path on a local server): neither says anything the policy can act on, and together they were
# nearly half of a page's tokens. BrowserGym drops repeated StaticText the same way.
_REPEATED_TEXT = re.compile(r"^[ \t]*InlineTextBox '.*'\n?", re.MULTILINE)
_URL_PROPERTY = re.compile(r", url='[^'\n]*'")


def compact_page(axtree_txt: str) -> str:
    """The accessibility tree without its InlineTextBox lines and url properties."""
    return _URL_PROPERTY.sub("", _REPEATED_TEXT.sub("", axtree_txt)).rstrip("\n")


def cut_page(axtree_txt: str, max_page_chars: int) -> str:
    """The page as the policy reads it: compacted, and cut at max_page_chars."""
    text = compact_page(axtree_txt)
    if len(text) > max_page_chars:
        text = text[:max_page_chars] + "\n[... page truncated]"
    return text


def feedback(turn: int, action: str | None, observation: BrowserGymObservation, cut_off: bool = False) -> str:
    """What became of the turn's action, which opens the next user message (the page follows it)."""
    if cut_off:
        outcome = "Your reply was cut off before it ended, so nothing was done. Reply with one short action."
    elif action is None:
        outcome = "Your reply contained no valid action. Reply with exactly one action, for example click('12')."
    elif observation.error:
        outcome = f"Action {action} failed: {observation.error.strip()[:500]}"
    else:
        outcome = f"Action {action} done."
    return f"Step {turn + 1}. {outcome}"


class ChatTurns:
    """Renders the conversation of an episode into token ids with the model's own chat template."""

    def __init__(self, tokenizer, max_page_chars: int, action_reference: bool = True):
        self.tokenizer = tokenizer
        self.max_page_chars = max_page_chars
        self.system_prompt = SYSTEM_PROMPT if action_reference else INSTRUCTIONS
        # What the template writes after an assistant reply ends, found by rendering one: with the reply's
        # end-of-turn token already sampled by the model, only the rest of it is the environment's.
        reply = "\x00reply\x00"
        self._probe = [{"role": "user", "content": "goal"}, {"role": "assistant", "content": reply}]
        self._rendered_probe = self._render(self._probe)
        self._after_reply = self._rendered_probe[self._rendered_probe.rindex(reply) + len(reply) :]

    def first_prompt(self, observation: BrowserGymObservation) -> list[int]:
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.observation_message(observation)},
        ]
        return self._encode(self._render(messages, add_generation_prompt=True))

    def next_turn(self, reply_ids: list[int], user_text: str) -> list[int]:
        """The tokens between one sampled reply and the next: end of the reply, user message, reply header."""
        with_user = self._render(self._probe + [{"role": "user", "content": user_text}], add_generation_prompt=True)
        opening = with_user[len(self._rendered_probe) :]
        closing = self._after_reply
        eos = self.tokenizer.eos_token
        if reply_ids and reply_ids[-1] == self.tokenizer.eos_token_id and closing.startswith(eos):
            closing = closing[len(eos) :]
        return self._encode(closing + opening)

    def observation_message(self, observation: BrowserGymObservation, outcome: str | None = None) -> str:
        """A user message: what became of the last action, if any, then the page, then the goal. The goal comes
        last, every turn, so that the text a reply copies or matches from it sits just before the reply rather
        than behind one or more pages (a small model copies near text long before it learns to reach far)."""
        parts = [outcome] if outcome else []
        return "\n\n".join([*parts, self.page(observation), f"Goal: {observation.goal}"])

    def page(self, observation: BrowserGymObservation) -> str:
        return f"Page:\n{cut_page(observation.axtree_txt or observation.text, self.max_page_chars)}"

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)
