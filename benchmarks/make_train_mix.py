"""Write the bundled training mix, ``specbuild/data/train_mix.jsonl`` (``train.prompts: mixed``).

Every prompt is made here from word lists and templates written for specbuild (no third-party text), so
the file is ours to license with the project; nothing is downloaded. Six categories, 100 prompts each,
interleaved (chat, code, math, summarization, translation, qa, chat, ...) so that ``mixed:N`` and
``train.max_prompts`` keep the categories balanced. Ids: ``mixed/<category>/<n>``.

The prompts are user messages (the training stage puts them inside the target's chat template); the
target writes the responses itself. They are kept apart from every evaluation set (Spec-Bench, HumanEval,
the bundled chat and summarisation sets): ``tests/test_train_mix.py`` checks exact and near duplicates.

Usage (deterministic: the same seed writes the same file)::

    python benchmarks/make_train_mix.py [--seed 0] [--per-category 100] [--out specbuild/data/train_mix.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "specbuild" / "data" / "train_mix.jsonl"
CATEGORIES = ("chat", "code", "math", "summarization", "translation", "qa")  # = specbuild.prompts.MIXED_CATEGORIES

NAMES = ["Amara", "Bruno", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Ines", "Jonas", "Kiri", "Luca", "Mei",
         "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Viktor", "Wen", "Yara", "Zofia"]
PLACES = ["Lisbon", "Kyoto", "Vancouver", "Marrakesh", "Oslo", "Cape Town", "Hanoi", "Edinburgh", "Valparaiso",
          "Tbilisi", "Ljubljana", "Hobart", "Cartagena", "Tallinn", "Penang"]

# --- chat / instruction ------------------------------------------------------------------------------

RECIPIENTS = ["my landlord", "a new coworker", "my neighbour", "the project team", "a customer who was overcharged",
              "my manager", "a volunteer group", "my cousin", "the school board", "a hiring manager"]
LETTER_TOPICS = ["a leaking kitchen tap", "moving the weekly meeting to Thursday", "a delayed delivery",
                 "thanks for help during a busy week", "a noisy party planned for Saturday", "a new recycling schedule",
                 "a request for two days of leave", "feedback on a draft proposal", "a lost parcel", "a charity bake sale"]
ACTIVITIES = ["learning to play the ukulele", "keeping houseplants alive", "running a first 10k race", "cooking for one person",
              "working from a small flat", "saving money on groceries", "sleeping better on night shifts",
              "starting a vegetable garden on a balcony", "preparing for a job interview", "learning a language after forty",
              "hosting a board game night", "travelling with a toddler"]
AUDIENCES = ["ten-year-old", "retired engineer", "first-year student", "busy parent", "tourist"]
PHENOMENA = ["bread rises", "ice floats on water", "leaves change colour in autumn", "we get hiccups",
             "a bicycle stays upright when moving", "metal feels colder than wood", "the moon has phases",
             "onions make people cry", "cats purr", "airplanes can fly"]
TONES = ["polite", "confident", "friendly", "formal", "concise"]
SENTENCES = ["I need the report by tomorrow or we will miss the deadline.", "Your order was late because the warehouse messed up.",
             "We can't come to the dinner on Friday.", "The app keeps crashing and nobody has fixed it.",
             "Send me the files when you get a chance.", "The meeting was a waste of time."]
THINGS = [("bakery", "sells sourdough and coffee"), ("podcast", "talks about old maps"), ("dog-walking service", "works at night"),
          ("board game", "is about trading spices"), ("bookshop", "only sells travel writing"), ("app", "reminds you to drink water")]
CHOICES = ["renting versus buying a flat", "electric versus petrol cars", "working four longer days a week",
           "learning to code with a bootcamp", "buying a used laptop", "keeping a paper diary", "taking a gap year"]


def chat_prompts(rng: random.Random) -> list[str]:
    forms: list[Callable[[], str]] = [
        lambda: f"Write a short {rng.choice(['email', 'note', 'message', 'letter'])} to {rng.choice(RECIPIENTS)} about {rng.choice(LETTER_TOPICS)}.",
        lambda: f"Give me {rng.randint(3, 7)} practical tips for {rng.choice(ACTIVITIES)}.",
        lambda: f"Explain to a {rng.choice(AUDIENCES)} why {rng.choice(PHENOMENA)}.",
        lambda: f"Rewrite this sentence to sound more {rng.choice(TONES)}: \"{rng.choice(SENTENCES)}\"",
        lambda: "Suggest five names for a {} that {}.".format(*rng.choice(THINGS)),
        lambda: f"Plan a {rng.randint(2, 5)}-day visit to {rng.choice(PLACES)} for someone who likes {rng.choice(['food markets', 'hiking', 'museums', 'architecture', 'live music', 'quiet beaches'])}.",
        lambda: f"What are the pros and cons of {rng.choice(CHOICES)}? Answer in a short list.",
        lambda: f"My friend {rng.choice(NAMES)} is {rng.choice(['nervous about a driving test', 'moving abroad next month', 'starting a new job on Monday', 'recovering from a cold'])}. Write a kind message I can send.",
        lambda: f"Write a four-line poem about {rng.choice(['a tram at dawn', 'an old umbrella', 'the first snow', 'a lighthouse keeper', 'a quiet library', 'a kettle'])}.",
        lambda: f"Help me write a to-do list for {rng.choice(['a weekend move', 'spring cleaning', 'a birthday party for twelve', 'the first week of a new job', 'a camping trip'])}.",
    ]
    return [rng.choice(forms)() for _ in range(400)]


# --- code ------------------------------------------------------------------------------------------

LANGUAGES = ["Python", "JavaScript", "Go", "Rust", "Java", "C", "TypeScript", "Ruby"]
TASKS = [
    ("chunk_list", "splits a list into chunks of a given size, the last chunk possibly shorter"),
    ("count_vowels", "counts the vowels in a string, ignoring case"),
    ("merge_intervals", "merges overlapping [start, end] intervals and returns them sorted"),
    ("is_anagram", "checks whether two words use exactly the same letters"),
    ("flatten", "flattens a nested list of integers of any depth"),
    ("rle_encode", "run-length encodes a string, so 'aaabcc' becomes 'a3b1c2'"),
    ("moving_average", "returns the moving average of a list of numbers over a window of k values"),
    ("parse_duration", "parses strings like '1h30m' or '45s' into a number of seconds"),
    ("top_k_words", "returns the k most frequent words of a text, ties broken alphabetically"),
    ("rotate_matrix", "rotates a square matrix 90 degrees clockwise"),
    ("validate_ipv4", "checks whether a string is a valid IPv4 address"),
    ("dedupe_keep_order", "removes duplicates from a list while keeping the first occurrence of each"),
    ("snake_to_camel", "converts snake_case identifiers to camelCase"),
    ("binary_search", "finds the index of a value in a sorted array, or -1 when it is absent"),
    ("word_wrap", "wraps a paragraph to lines of at most n characters without splitting words"),
    ("histogram", "prints a text histogram of integer counts using '#' characters"),
    ("roman_to_int", "converts a Roman numeral such as 'MCMXCIV' to an integer"),
    ("group_by_length", "groups words into a dictionary keyed by their length"),
    ("safe_divide", "divides two numbers and returns None instead of failing on division by zero"),
    ("matrix_multiply", "multiplies two matrices given as lists of rows"),
]
SNIPPETS = [
    ("Python", "def f(xs):\n    out = {}\n    for x in xs:\n        out[x % 3] = out.get(x % 3, 0) + 1\n    return out"),
    ("JavaScript", "const g = (s) => s.split('').reverse().join('') === s;"),
    ("Python", "total = 0\nfor line in open('prices.txt'):\n    total += float(line.split(',')[1])\nprint(round(total, 2))"),
    ("Go", "func sum(ns []int) (s int) {\n\tfor _, n := range ns {\n\t\ts += n\n\t}\n\treturn\n}"),
    ("Rust", "fn largest(v: &[i32]) -> Option<i32> {\n    v.iter().copied().max()\n}"),
    ("SQL", "SELECT city, COUNT(*) AS n FROM orders GROUP BY city HAVING COUNT(*) > 10 ORDER BY n DESC;"),
]
BUGGY = [
    "def average(values):\n    return sum(values) / len(values) + 1",
    "def last_item(items):\n    return items[len(items)]",
    "def count_words(text):\n    counts = {}\n    for w in text.split():\n        counts[w] = 1\n    return counts",
    "def is_even(n):\n    return n % 2 == 1",
]


def code_prompts(rng: random.Random) -> list[str]:
    forms: list[Callable[[], str]] = [
        lambda: "Write a {} function `{}` that {}.".format(rng.choice(LANGUAGES), *rng.choice(TASKS)),
        lambda: "Write a {} function `{}` that {}. Include two example calls.".format(rng.choice(LANGUAGES), *rng.choice(TASKS)),
        lambda: "Explain what this {} code does, line by line:\n\n```\n{}\n```".format(*rng.choice(SNIPPETS)),
        lambda: f"This Python function has a bug. Find it and give the corrected code:\n\n```python\n{rng.choice(BUGGY)}\n```",
        lambda: "Write unit tests with pytest for a function `{}` that {}.".format(*rng.choice(TASKS)),
        lambda: f"Write a shell command that {rng.choice(['finds every .log file over 10 MB under /var', 'counts the lines of all Python files in a folder', 'renames every .jpeg file to .jpg', 'shows the five largest directories in the home folder'])}.",
        lambda: f"Write a SQL query that returns {rng.choice(['the three customers with the highest total spend', 'the number of orders per month in 2023', 'products that were never ordered', 'the average delivery time per warehouse'])} from tables customers, orders and products.",
    ]
    return [rng.choice(forms)() for _ in range(400)]


# --- math ------------------------------------------------------------------------------------------


def math_prompts(rng: random.Random) -> list[str]:
    def word_problem() -> str:
        name, other = rng.sample(NAMES, 2)
        a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(2, 9)
        return rng.choice([
            f"{name} packs {a} jars of jam into boxes of {b}. How many full boxes are there, and how many jars are left over?",
            f"A cinema sells {a} tickets at {b} euros and {c} tickets at half price. How much money does it take in?",
            f"{name} cycles {a} km at {b + 10} km/h and then {c} km at {b + 5} km/h. How long does the whole ride take?",
            f"{name} has {a * 2} marbles and gives a quarter of them to {other}, who already had {c}. How many does {other} have now?",
            f"A tank holds {a * 10} litres and leaks {b} litres an hour. After how many hours is it less than half full?",
            f"The price of a lamp rises by {b}% and then falls by {c}%. It started at {a * 5} dollars. What does it cost now?",
        ]) + " Show your reasoning step by step."

    forms: list[Callable[[], str]] = [
        word_problem, word_problem, word_problem,
        lambda: f"Solve for x: {rng.randint(2, 9)}x + {rng.randint(1, 30)} = {rng.randint(31, 99)}. Explain each step.",
        lambda: f"What is {rng.choice([5, 12, 15, 35, 64])}% of {rng.randint(40, 900)}? Show the working.",
        lambda: f"Find the derivative of f(x) = {rng.randint(2, 7)}x^{rng.randint(2, 5)} - {rng.randint(1, 9)}x + {rng.randint(1, 20)}.",
        lambda: f"A rectangle is {rng.randint(3, 25)} cm long and {rng.randint(2, 15)} cm wide. Find its area, perimeter and the length of its diagonal.",
        lambda: f"Two dice are thrown. What is the probability that the total is {rng.randint(3, 11)}? Explain.",
        lambda: f"Simplify the fraction {(k := rng.randint(2, 9)) * rng.randint(2, 12)}/{k * rng.randint(13, 30)} and explain how.",
        lambda: f"Is {rng.randint(101, 997)} a prime number? Explain how you check.",
    ]
    return [rng.choice(forms)() for _ in range(400)]


# --- summarisation -----------------------------------------------------------------------------------

COMPANIES = ["Harbour Lights Ferries", "Greenleaf Grocers", "Northwind Bicycles", "Bluefield Clinic", "Copperpot Kitchens"]


def passage(rng: random.Random) -> tuple[str, str]:
    name, other = rng.sample(NAMES, 2)
    place, company = rng.choice(PLACES), rng.choice(COMPANIES)
    n, m, year = rng.randint(12, 95), rng.randint(2, 9), rng.randint(2015, 2024)
    kind, sentences = rng.choice([
        ("meeting notes", [
            f"The residents' association of the Eastgate district in {place} met on a Tuesday evening with {n} members present.",
            f"{name}, the chair, opened with the budget: the association spent {m} thousand on repairs to the community hall last year.",
            "Several members complained that the hall's heating still fails on cold mornings.",
            f"{other} proposed asking three contractors for quotes before the winter, and the meeting agreed.",
            "A long discussion followed about parking on the narrow streets near the school.",
            "No decision was reached on parking; a small group will collect suggestions and report next month.",
            "The meeting closed with thanks to the volunteers who organised the summer street fair.",
        ]),
        ("product announcement", [
            f"{company} announced a new service for customers in {place} this week.",
            f"Starting next month, customers can book through a phone app instead of calling the office.",
            f"The company says the change will cut waiting times by about {n} percent.",
            f"{name}, who manages operations, said the old booking system had been in use since {year}.",
            "Older customers will still be able to book by phone, and staff will help anyone who struggles with the app.",
            f"The app will first be tested with {m * 100} customers before it reaches everyone.",
            "Critics say the company should first fix the frequent delays before adding new features.",
        ]),
        ("incident report", [
            f"On a Friday afternoon the main water pipe in the warehouse of {company} in {place} burst.",
            f"Staff noticed water on the loading floor at about {m} o'clock and shut the main valve within twenty minutes.",
            f"Around {n} boxes of stock were damaged, mostly paper goods stored on the lowest shelves.",
            "Nobody was hurt, and deliveries resumed the next morning from a second loading bay.",
            f"{name} from the facilities team found that the pipe had corroded at a joint installed in {year}.",
            "The report recommends replacing all joints of that type and raising the lowest shelves by thirty centimetres.",
            "Insurance is expected to cover most of the cost of the damaged goods.",
        ]),
        ("local news story", [
            f"A community garden opened last weekend on an empty lot behind the old railway station in {place}.",
            f"The project was started by {name}, a retired teacher, who spent {m} years persuading the council to lease the land.",
            f"More than {n} neighbours helped to clear rubble, build raised beds and plant fruit trees.",
            "Each household can rent a bed for a small yearly fee, and a third of the beds are kept for the nearby school.",
            f"{other}, who lives across the street, said the lot had been a dumping ground since {year}.",
            "The council has promised water connections, but the gardeners are still waiting for them.",
            "The organisers hope to hold a harvest festival in the autumn.",
        ]),
    ])
    return kind, " ".join(sentences)


def summarization_prompts(rng: random.Random) -> list[str]:
    def one() -> str:
        kind, text = passage(rng)
        this = "these" if kind.endswith("notes") else "this"
        return rng.choice([
            f"Summarise {this} {kind} in {rng.randint(2, 3)} sentences:\n\n{text}",
            f"Write a one-paragraph summary of the following {kind} for someone who has not read it.\n\n{text}",
            f"Read the {kind} below and list its three most important points as bullets.\n\n{text}",
            f"Give a headline and a two-sentence summary for {this} {kind}:\n\n{text}",
        ])

    return [one() for _ in range(400)]


# --- translation -------------------------------------------------------------------------------------

TARGET_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Polish", "Japanese", "Chinese"]
SUBJECTS = ["My sister", "The old fisherman", "Our neighbours", "The new teacher", "A tired traveller", "The children", "My grandfather"]
VERBS = ["is looking for", "forgot", "painted", "would like to buy", "found", "repaired", "is waiting for"]
OBJECTS = ["a red umbrella", "the key to the garden gate", "a cheap room near the station", "the blue bicycle",
           "a recipe for lemon cake", "the last train home", "a map of the old town"]
ENDINGS = ["before the rain started.", "because the shop was closing.", "yesterday morning.", "near the harbour.",
           "after a long day at work.", "without telling anyone."]
OWN_SOURCES = [  # short sentences written for specbuild, for translation into English
    ("French", "Le boulanger ouvre sa boutique à six heures chaque matin."),
    ("Spanish", "Mañana vamos a visitar a mis abuelos en el campo."),
    ("German", "Der Zug nach Norden hat heute zwanzig Minuten Verspätung."),
    ("Italian", "La biblioteca resta chiusa durante le vacanze estive."),
    ("Portuguese", "Os vizinhos plantaram tomates no quintal."),
    ("French", "Nous avons oublié les billets sur la table de la cuisine."),
]


def translation_prompts(rng: random.Random) -> list[str]:
    def sentence() -> str:
        return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}"

    forms: list[Callable[[], str]] = [
        lambda: f"Translate into {rng.choice(TARGET_LANGUAGES)}: {sentence()}",
        lambda: f"How would you say \"{sentence()}\" in {rng.choice(TARGET_LANGUAGES)}?",
        lambda: f"Translate these two sentences into {rng.choice(TARGET_LANGUAGES)}, keeping the tone informal: {sentence()} {sentence()}",
        lambda: "Translate this {} sentence into English: {}".format(*rng.choice(OWN_SOURCES)),
    ]
    return [rng.choice(forms)() for _ in range(400)]


# --- question answering ------------------------------------------------------------------------------

CONCEPT_PAIRS = [("weather", "climate"), ("a virus", "a bacterium"), ("RAM", "disk storage"), ("speed", "velocity"),
                 ("an atom", "a molecule"), ("a comet", "an asteroid"), ("inflation", "deflation"), ("a lake", "a lagoon"),
                 ("TCP", "UDP"), ("a simile", "a metaphor"), ("mitosis", "meiosis"), ("a loan", "a lease")]
MECHANISMS = ["a refrigerator keeps food cold", "a vaccine trains the immune system", "noise-cancelling headphones work",
              "a compass finds north", "tides are caused", "a solar panel makes electricity", "a bill becomes law in a parliament",
              "a search engine ranks pages", "yeast makes dough rise", "a lock with pin tumblers opens"]
FACT_QUESTIONS = ["Which planet in our solar system has the most moons, and why is the count uncertain?",
                  "What causes the seasons on Earth?", "How many bones does an adult human have, and why do babies have more?",
                  "What does a blood pressure reading like 120/80 mean?", "Why do some countries drive on the left?",
                  "Why do onions grow in layers?", "How long does light from the Sun take to reach Earth?",
                  "What is the difference between an ocean and a sea?", "Who invented the printing press with movable type in Europe, and when?",
                  "Why is the Dead Sea so salty?"]


CONCEPTS = ["compound interest", "photosynthesis", "a black hole", "supply and demand", "plate tectonics", "an index fund",
            "the greenhouse effect", "a food chain", "public-key encryption", "a leap year", "the placebo effect",
            "opportunity cost", "continental drift", "a tax bracket", "the water cycle", "natural selection"]


def qa_prompts(rng: random.Random) -> list[str]:
    forms: list[Callable[[], str]] = [
        lambda: f"Explain {rng.choice(CONCEPTS)} in simple terms.",
        lambda: f"What is {rng.choice(CONCEPTS)}? Give one everyday example.",
        lambda: f"What are common misconceptions about {rng.choice(CONCEPTS)}?",
        lambda: "What is the difference between {} and {}?".format(*rng.choice(CONCEPT_PAIRS)),
        lambda: f"Briefly explain how {rng.choice(MECHANISMS)}.",
        lambda: rng.choice(FACT_QUESTIONS),
        lambda: f"Answer in one sentence, then explain: {rng.choice(FACT_QUESTIONS)}",
        lambda: "Give a short answer: is {} more like {} or not at all? Explain the key difference.".format(*rng.choice(CONCEPT_PAIRS)),
    ]
    return [rng.choice(forms)() for _ in range(400)]


MAKERS = {"chat": chat_prompts, "code": code_prompts, "math": math_prompts, "summarization": summarization_prompts,
          "translation": translation_prompts, "qa": qa_prompts}


def make_mix(seed: int, per_category: int) -> list[dict[str, str]]:
    """``per_category`` distinct prompts of each category (first occurrence kept), interleaved by category."""
    columns = []
    for k, category in enumerate(CATEGORIES):
        rng = random.Random(seed * 1000 + k)
        unique = list(dict.fromkeys(MAKERS[category](rng)))
        if len(unique) < per_category:
            raise SystemExit(f"{category}: only {len(unique)} distinct prompts; add templates or lower --per-category")
        columns.append([{"id": f"mixed/{category}/{i}", "prompt": p} for i, p in enumerate(unique[:per_category])])
    return [column[i] for i in range(per_category) for column in columns]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-category", type=int, default=100)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    records = make_mix(args.seed, args.per_category)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    print(f"wrote {len(records)} prompts to {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
