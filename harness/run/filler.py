"""The context a task's `depth` puts before its prompt, like llama-bench's `-d`: a filler of exactly that many tokens
of the target's own tokenizer, then a blank line, then the prompt (inside the user's message with `endpoint: chat`).

What the filler is. N-gram drafters (ngram-simple, ngram-mod, ngram-cache, ...) draft by finding the last tokens
again earlier in the context: a repetitive filler would hand them matches no user's context holds, and a copy of the
prompt would hand them the answer. So the filler is English words the kit ships (`WORDS`, below), drawn uniformly
with a fixed seed (`SEED`, Python's Mersenne Twister: the same text on every machine and version), never the same
word twice in a row, in sentences of 6 to 14 words: a text without structure an n-gram could learn. With the 629
words below (measured): 1,024 words repeat no word pair, 4,096 words repeat 21 pairs and 16,384 words 325 pairs
(which a drafter may try and lose), and none of them repeats a word triple. The filler is cut to `depth` tokens by
the server itself (untimed POST /tokenize, the first `depth` ids, POST /detokenize, and /tokenize again to count the
text sent), and its sha256 and token count go into the record (`context`); the prompt's real token count is the
server's `timings.prompt_n` (record `server.prompt_n`)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from harness.hosts.engine import Endpoint

#: The seed of the word sequence (a string seed is hashed by `random`, stable across Python versions).
SEED = "specbench-filler-1"
WORDS = tuple("""
able about above across act add after again against age ago agree air all allow almost alone along already also
always among amount ancient animal answer any appear apple area arm army around arrive art ask autumn away baby back
bad bag ball bank base basket bear beat beauty become bed before begin behind believe bell below best better between
bird black blood blue board boat body bone book border born both bottle bottom box boy branch bread break bridge
bright bring broad brother brown build burn busy buy call calm camp candle capital captain car card care carry case
castle cat catch cause cell center century chair chance change charge cheap chief child choose church circle city
claim class clean clear climb clock close cloth cloud coast coat cold collect colony color column come common company
compare copper corn corner cost cotton count country course cover cow crop cross crowd cry current cut dance dark
daughter day dead deal dear decide deep degree desert design desk detail develop die differ direct distant divide
doctor dog door double down draw dream dress drink drive drop dry duck during dust duty early earth east easy eat
edge effect egg eight either electric element else end enemy energy engine enough enter equal even evening event
ever every exact example except exercise expect eye face fact fair fall family famous far farm fast father fear feed
feel few field fight figure fill final find fine finger fire first fish fit five flat floor flow flower fly follow
food foot forest form forward four free fresh friend front fruit full game garden gas gather gentle gift girl give
glad glass gold good grass gray great green ground group grow guess guide hair half hall hand happen happy hard hat
head hear heart heat heavy help high hill history hold hole home hope horse hot hour house huge human hundred hunt
hurry ice idea inch include industry insect iron island join joy judge jump keep key kind king kitchen knee knife
know lady lake land language large last late laugh law lay lead learn leave left leg length letter level lie life
lift light line lip liquid list listen little live long look lost loud love low machine main major make man many map
mark market mass master match material matter meal measure meat meet melody metal middle might mile milk million mind
mine minute miss modern moment money month moon morning mother motion mountain mouth move music name nation natural
near neck need neighbor nest never new next night nine noise noon north nose note nothing notice number object ocean
offer office often oil old open opinion orange order organ other oxygen page paint pair paper parent part party pass
past path pattern pay people period person pick picture piece pitch place plain plan plant play please plenty poem
point pole poor port position possible pound power press pretty print prison produce proper protect proud prove pull
push quart queen quick quiet quite race radio rain raise reach read ready real reason record region remember repeat
reply rest rich ride right ring river road rock roll roof room root rope rose round row rule run safe sail salt sand
save scale school science score sea season seat second seed self sell send sense sentence serve settle seven shade
shape share sharp sheep shell shine ship shoe shop shore short shoulder shout side sight silver simple sing sister
sit six size skill skin sky sleep slow small smell smile snow soft soil soldier solve song soon sound south space
speak special speed spend spoke spring square stand star start station stay steam steel step stick still stone stood
store storm story straight strange stream street strong student study subject sugar summer sun supply surface
""".split())

assert len(WORDS) == 629 and len(set(WORDS)) == 629  # the module docstring's figures rest on these
#: What the record names as the filler's source.
SOURCE = f"harness/run/filler.py WORDS ({len(WORDS)} words), seed {SEED!r}"


def words(n: int) -> str:
    """The first n words of the filler, in sentences (the same text for the same n on every machine)."""
    rng = random.Random(SEED)
    out: list[str] = []
    sentence: list[str] = []
    length = rng.randint(6, 14)
    last = ""
    for _ in range(n):
        w = rng.choice(WORDS)
        while w == last:
            w = rng.choice(WORDS)
        last = w
        sentence.append(w.capitalize() if not sentence else w)
        if len(sentence) == length:
            out.append(" ".join(sentence) + ".")
            sentence, length = [], rng.randint(6, 14)
    if sentence:
        out.append(" ".join(sentence) + ".")
    return " ".join(out)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def with_prompt(filler_text: str, prompt: str) -> str:
    """The text the model reads: the filler, a blank line, the prompt."""
    return f"{filler_text}\n\n{prompt}" if filler_text else prompt


def context_record(depth: int, tokens: int, text: str) -> dict[str, Any]:
    """What a record says of its filler (`context`)."""
    return {"depth": depth, "filler_tokens": tokens, "filler_sha256": sha256(text), "filler_chars": len(text),
            "source": SOURCE}


def prefix(endpoint: Endpoint, depth: int, timeout_s: float, post: Any) -> tuple[str, int]:
    """The filler cut to `depth` tokens of the server's tokenizer (untimed; `post` is client.post_json): its text
    and the token count that text has, tokenized again. Every word is at least one token, so `depth` words are
    enough."""
    text = words(depth)
    ids = post(endpoint, "/tokenize", {"content": text, "add_special": False}, timeout_s, "template").get("tokens")
    if not isinstance(ids, list) or len(ids) < depth or not all(isinstance(i, int) for i in ids[:depth]):
        raise ValueError(f"/tokenize gave {len(ids) if isinstance(ids, list) else 'no'} token ids for the filler; "
                         f"expected at least {depth}")
    cut = post(endpoint, "/detokenize", {"tokens": ids[:depth]}, timeout_s, "template").get("content")
    if not isinstance(cut, str):
        raise ValueError("/detokenize answered without content")
    cut = cut.strip()
    # the count it has as text (a cut can merge or split at its edge): what the record states
    again = post(endpoint, "/tokenize", {"content": cut, "add_special": False}, timeout_s, "template").get("tokens")
    if not isinstance(again, list):
        raise ValueError("/tokenize answered without tokens for the cut filler")
    return cut, len(again)
