"""An episode as GRPO trains on it: one token sequence, exactly as the policy saw and wrote it.

The first prompt, then for each turn the sampled reply followed by the environment's next message, rendered with the
chat template (prompts.py) and never re-tokenized. `env_mask` marks the sampled tokens (1) apart from the environment's
and a guide's (0), so a trainer scores every reply against the very context it was sampled from. The live loop
(browser_rl.rollout) and warm_start.demonstrations build it with the same three calls: begin, add_reply, add_outcome.
"""

from dataclasses import dataclass, field

from browser_rl.generation import Reply
from browser_rl.prompts import ChatTurns, feedback
from rewards import solved
from web_env.actions import parse_action
from web_env.models import BrowserGymObservation


@dataclass
class Episode:
    task_name: str
    seed: int
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    actions: list[str | None] = field(default_factory=list)
    done: bool = False
    env_reward: float = 0.0  # as the server sent it: 1.0 only for the task solved (this project's server)
    browsergym_reward: float = 0.0  # BrowserGym's score, float(raw > 0), which pays some wrong endings: for comparison
    raw_reward: float | None = None  # the page's own, which the server reports beside it (None: a server that does not)
    out_of_context: bool = False  # ended because its context left no room for another reply
    restarted_in_page: bool | None = None  # whether the server restarted it in a loaded page (None: not said)
    guide_turns: int = 0  # its first turns a guide plays (browser_rl.guidance): shown to the policy, not trained on
    first_observation: BrowserGymObservation | None = None
    observation: BrowserGymObservation | None = None
    pages: list[str] = field(default_factory=list)  # each page the policy was shown, as the server sent it
    errors: list[str] = field(default_factory=list)  # each turn's action error ("" if none, or if no action)
    ended: list[bool] = field(default_factory=list)  # whether each reply ended, rather than being cut off
    rewards: list[float] = field(default_factory=list)  # each turn's reward, as the server sent it
    # A traced episode's (EpisodeRunner.run's `traced`): each page it saw as a JPEG, the first and one after each
    # turn, and the box of the element each turn's action acted on (None: no action, or none on an element).
    images: list[str | None] = field(default_factory=list)
    boxes: list[list[float] | None] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return len(self.actions)

    @property
    def solved(self) -> bool:
        return solved(self.task_name, self.done, self.env_reward, self.raw_reward)

    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def reply_mask(self) -> list[int]:
        """1 on the context's reply tokens, 0 on the environment's: what a supervised loss is taken on."""
        return [0] * len(self.prompt_ids) + self.env_mask

    def outcome(self) -> "Episode":
        """The episode as the step's figures read it (its task, actions and ending) without its tokens and
        observations: what ranks send each other."""
        return Episode(
            self.task_name,
            self.seed,
            actions=list(self.actions),
            done=self.done,
            env_reward=self.env_reward,
            raw_reward=self.raw_reward,
            out_of_context=self.out_of_context,
            restarted_in_page=self.restarted_in_page,
            guide_turns=self.guide_turns,
        )

    def add_policy_tokens(self, ids: list[int], logprobs: list[float]) -> None:
        self.completion_ids += ids
        self.env_mask += [1] * len(ids)
        self.logprobs += logprobs

    def add_environment_tokens(self, ids: list[int]) -> None:
        self.completion_ids += ids
        self.env_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def end_out_of_context(self) -> None:
        """Ends the episode unsolved, without the environment's message that no reply will answer."""
        if self.env_mask and self.env_mask[-1] == 0:
            self.pages.pop()
        while self.env_mask and self.env_mask[-1] == 0:
            self.completion_ids.pop()
            self.env_mask.pop()
            self.logprobs.pop()
        self.out_of_context = True


# How an episode's tokens are built, one call per event, by the live loop below and by warm_start.demonstrations from a
# recorded episode alike: a demonstration renders token for token as the episode that played it.
def begin(episode: Episode, chat: ChatTurns, observation: BrowserGymObservation) -> None:
    """The episode's first page, and the prompt it makes."""
    episode.first_observation = episode.observation = observation
    episode.pages.append(observation.axtree_txt)
    episode.images.append(observation.page_image)
    episode.prompt_ids = chat.first_prompt(observation)


def reply_action(tokenizer, reply: Reply) -> tuple[str, str | None]:
    """The reply's text, and the action it asks for: None when it has none, or when it was cut off by the length
    limit (even if it began with an action: otherwise the policy is rewarded for never ending its replies)."""
    text = tokenizer.decode(reply.ids, skip_special_tokens=True)
    return text, parse_action(text) if reply.ended else None


def add_reply(episode: Episode, chat: ChatTurns, reply: Reply) -> str | None:
    """The policy's reply, and the action it asks for (reply_action)."""
    text, action = reply_action(chat.tokenizer, reply)
    if reply.guided:
        episode.add_environment_tokens(reply.ids)
    else:
        episode.add_policy_tokens(reply.ids, reply.logprobs)
    episode.replies.append(text)
    episode.actions.append(action)
    episode.ended.append(reply.ended)
    return action


def add_outcome(
    episode: Episode,
    chat: ChatTurns,
    reply: Reply,
    observation: BrowserGymObservation,
    done: bool,
    reward: float,
    more_turns: bool,
) -> None:
    """What the last reply's action led to (the page after it: the same page if it had no action), and, if the
    episode goes on, the message that shows it to the policy."""
    action = episode.actions[-1]
    episode.observation, episode.done, episode.env_reward = observation, done, reward
    episode.raw_reward = observation.metadata.get("raw_reward")
    # OpenEnv's public BrowserGym server sends BrowserGym's score as its reward, and nothing beside it
    episode.browsergym_reward = observation.metadata.get("browsergym_reward", reward)
    episode.errors.append(observation.error if action is not None else "")
    episode.rewards.append(reward)
    episode.images.append(observation.page_image)
    episode.boxes.append(observation.action_box if action is not None else None)  # without one: the last action's
    if not done and more_turns:
        outcome = feedback(episode.turns - 1, action, observation, cut_off=not reply.ended)
        episode.add_environment_tokens(chat.next_turn(reply.ids, chat.observation_message(observation, outcome)))
        episode.pages.append(observation.axtree_txt)
