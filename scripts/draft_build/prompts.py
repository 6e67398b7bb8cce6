"""Stage 1's data: the chat prompts the target answers, and the held-out prompts the evaluation uses.

:func:`build_prompts` makes a seeded, de-duplicated mix of topics x question templates, code,
maths, rewriting, advice, recipes and small talk. :data:`COURSE_PROMPTS` (used by the package
and the notebooks) and :data:`EVAL_PROMPTS` are never in it: the draft is judged on text it
was not trained on.
"""

from __future__ import annotations

import random

TOPICS = {
    "science": [
        "photosynthesis", "black holes", "the water cycle", "plate tectonics", "DNA", "climate change",
        "vaccines", "the immune system", "quantum mechanics", "electricity", "magnetism", "the speed of light",
        "evolution", "the periodic table", "chemical reactions", "volcanoes", "earthquakes", "the solar system",
        "the phases of the moon", "gravity", "sound waves", "rainbows", "antibiotics", "the human heart", "sleep",
        "nutrition", "the greenhouse effect", "solar power", "nuclear energy", "bacteria", "the human brain",
        "stars", "atoms", "cells", "the ocean", "weather forecasting", "genetics", "the Big Bang", "microscopes",
    ],
    "technology": [
        "machine learning", "neural networks", "the internet", "cloud computing", "cybersecurity", "blockchain",
        "smartphones", "electric cars", "3D printing", "robots", "databases", "operating systems", "encryption",
        "open source software", "virtual reality", "GPS", "search engines", "social media", "computer memory",
        "compilers", "version control", "web browsers", "Wi-Fi", "programming languages", "video games",
        "artificial intelligence", "passwords", "spreadsheets", "email", "self-driving cars", "drones",
    ],
    "history": [
        "the Roman Empire", "the French Revolution", "the Industrial Revolution", "ancient Egypt",
        "the printing press", "World War I", "the Renaissance", "the Silk Road", "the Cold War",
        "the Apollo program", "the telephone", "the history of writing", "the Great Wall of China", "the Vikings",
        "the Aztecs", "ancient Greece", "the Ottoman Empire", "the history of medicine", "the Middle Ages",
        "the invention of the airplane", "the Olympic Games", "the steam engine", "the history of money",
    ],
    "everyday life": [
        "cooking pasta", "baking bread", "saving money", "time management", "learning a new language",
        "staying healthy", "running", "gardening", "houseplants", "coffee", "public speaking",
        "writing a resume", "job interviews", "moving to a new city", "traveling on a budget", "dogs", "cats",
        "meditation", "making friends", "studying for exams", "cleaning", "birthday parties", "stress",
        "buying a car", "cooking rice", "healthy breakfasts", "camping", "cycling", "swimming", "yoga",
        "board games", "reading habits", "working from home", "packing for a trip",
    ],
    "arts": [
        "jazz", "classical music", "impressionism", "photography", "poetry", "novels", "theater", "movies",
        "the guitar", "the piano", "drawing", "Shakespeare", "architecture", "dance", "graphic design",
        "pottery", "sculpture", "opera", "street art", "animation", "comic books", "folk music",
    ],
    "economy": [
        "inflation", "interest rates", "the stock market", "small businesses", "marketing", "supply and demand",
        "budgeting", "negotiation", "leadership", "remote work", "customer service", "taxes", "credit scores",
        "investing", "teamwork", "project management", "international trade", "cryptocurrency",
        "entrepreneurship", "banks", "insurance", "advertising",
    ],
    "nature": [
        "honeybees", "whales", "rainforests", "deserts", "coral reefs", "migratory birds", "wolves", "octopuses",
        "mushrooms", "oak trees", "penguins", "the Amazon river", "mountains", "glaciers", "butterflies",
        "elephants", "sharks", "ants", "tides", "the seasons", "rivers", "volcanic islands", "dolphins", "owls",
    ],
    "society": [
        "happiness", "friendship", "democracy", "free will", "the ethics of artificial intelligence",
        "education", "success", "kindness", "creativity", "curiosity", "honesty", "justice", "privacy",
        "cities", "public transportation", "recycling", "volunteering", "cultural diversity", "museums",
        "sports", "libraries", "social skills", "family traditions", "holidays",
    ],
}

TEMPLATES = [
    "Explain {t} in simple terms.", "What is {t}?", "Can you tell me about {t}?",
    "Give me three interesting facts about {t}.", "Write a short paragraph about {t}.",
    "Why is {t} important?", "What are the main ideas behind {t}?", "Explain {t} to a ten-year-old.",
    "List five key points about {t}.", "What are common misconceptions about {t}?",
    "Write a haiku about {t}.", "Write a short poem about {t}.", "Write a short story that involves {t}.",
    "Summarize the history of {t} in a few sentences.", "What are the pros and cons of {t}?",
    "How would you teach someone about {t}?", "Give me a fun fact about {t}.",
    "What should a beginner know about {t}?", "Describe {t} in one paragraph.",
    "What questions do people often ask about {t}?", "Write a tweet about {t}.",
    "Write an introduction for an essay on {t}.", "How has {t} changed over time?",
    "What is the future of {t}?", "Create a quiz with three questions about {t}.",
    "Give me a step-by-step guide to understanding {t}.", "How can I learn more about {t}?",
    "Write a short dialogue between two friends discussing {t}.", "Write an email to a colleague about {t}.",
    "I am curious about {t}. Where should I start?", "Tell me something surprising about {t}.",
    "Define {t} and give an example.", "Write a blog post outline about {t}.",
    "What are the biggest challenges related to {t}?", "Explain {t} using an analogy.",
    "In two sentences, what is {t}?", "Why do people find {t} interesting?",
    "Answer in a short paragraph: what is the most important thing about {t}?",
    "Give me two tips related to {t}, with one sentence each.", "Write a limerick about {t}.",
]
PAIR_TEMPLATES = [
    "Compare {t} and {u}.", "What is the difference between {t} and {u}?", "How is {t} related to {u}?",
    "Which is more interesting, {t} or {u}? Explain briefly.",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of a number",
    "returns the largest element of a list", "counts the vowels in a string", "sorts a list of numbers",
    "computes the Fibonacci sequence", "checks whether a word is a palindrome", "removes duplicates from a list",
    "converts Celsius to Fahrenheit", "finds the average of a list of numbers", "reads a text file and counts its lines",
    "merges two dictionaries", "computes the greatest common divisor of two numbers", "flattens a nested list",
    "checks whether a year is a leap year", "counts word frequencies in a sentence", "finds the second smallest number in a list",
    "capitalizes every word in a sentence", "computes the sum of the digits of a number", "implements binary search",
    "checks whether two strings are anagrams", "generates a random password", "converts a number to binary",
]
CODE_TEMPLATES = [
    "Write a Python function that {c}.", "How do I write a program that {c}?",
    "Write a JavaScript function that {c}.", "Show me Python code that {c}, with comments.",
    "Write a short Python script that {c} and explain how it works.",
]
CODE_CONCEPTS = [
    "a for loop", "recursion", "a dictionary", "a class", "an exception", "a lambda function", "a list comprehension",
    "a linked list", "a stack", "a queue", "a hash table", "Big O notation", "a variable", "a function",
    "an API", "unit testing", "a pointer", "object-oriented programming", "a binary tree", "sorting algorithms",
]
CODE_CONCEPT_TEMPLATES = [
    "What is {c} in programming?", "Explain {c} with a simple example.", "When should I use {c}?",
    "Explain {c} to someone who is new to programming.",
]

ACTIVITIES = [
    "sleep better", "learn to cook", "save money for a vacation", "improve my writing", "stay focused while studying",
    "start running", "make new friends in a new city", "prepare for a job interview", "learn to play the guitar",
    "keep my room tidy", "drink more water", "reduce screen time", "be more productive in the morning",
    "learn to draw", "speak in public with confidence", "start a vegetable garden", "take better photos",
    "write a good cover letter", "remember what I read", "stay motivated to exercise", "plan a road trip",
    "deal with stress at work", "learn to code", "eat healthier", "get better at chess",
]
ACTIVITY_TEMPLATES = [
    "How can I {a}?", "What are some tips to {a}?", "Give me a simple plan to {a}.", "I want to {a}. Any advice?",
    "What is the best way to {a}?",
]
DISHES = [
    "pancakes", "tomato soup", "guacamole", "banana bread", "a vegetable stir-fry", "chocolate chip cookies",
    "a Greek salad", "scrambled eggs", "lentil curry", "lemonade", "homemade pizza", "fried rice",
    "an omelette", "apple pie", "hummus", "chicken noodle soup",
]
DISH_TEMPLATES = ["Give me a recipe for {d}.", "How do I make {d}?", "What ingredients do I need for {d}?"]

SENTENCES = [
    "the meeting was moved to friday because many people were sick",
    "i goed to the store yesterday and buyed some apples",
    "Our team finished the project two weeks ahead of schedule.",
    "The new park in the city centre has a lake, a playground and a small café.",
    "She has been learning Spanish for three years and now speaks it fluently.",
    "The train was late, so we missed the first part of the concert.",
    "Please send me the report by the end of the day.",
    "The weather today is sunny with a light breeze from the west.",
    "He forgot his umbrella and got wet on the way home.",
    "The museum is closed on Mondays but open late on Thursdays.",
    "Our company will launch a new app next month.",
    "The children planted tomatoes and beans in the school garden.",
]
SENTENCE_TEMPLATES = [
    "Rewrite this sentence to sound more formal: \"{s}\"", "Correct the grammar of this sentence: \"{s}\"",
    "Translate this sentence into French: \"{s}\"", "Make this sentence shorter: \"{s}\"",
    "Rewrite this sentence in the past tense: \"{s}\"", "Turn this sentence into a question: \"{s}\"",
]
SHORT_PROMPTS = [
    "Hi!", "Hello, how are you?", "What is your name?", "Tell me a joke.", "Thank you!", "Who are you?",
    "What can you do?", "Tell me a riddle.", "Good morning!", "Can you help me?", "Say something nice.",
    "What day comes after Tuesday?", "How many days are in a week?", "What color is the sky?",
]

# Prompts used by the course (package + notebooks) and the held-out evaluation set: never trained on.
COURSE_PROMPTS = [
    "Why do cats purr, and what does it mean when they do? Answer in a short paragraph.",
    "Why do leaves change colour in autumn? Answer in a short paragraph.",
    "Give three tips for writing clear emails.",
    "Give three tips for writing clear emails, with one sentence each.",
    "Explain what a hash table is to a new programmer.",
    "Explain in a short paragraph why the sky is blue.",
    "Write a short story about a robot who learns to paint.",
    "Give me three tips for learning a new language.",
    "Explain photosynthesis in two sentences.",
]
EVAL_PROMPTS = [
    "Why do cats purr, and what does it mean when they do? Answer in a short paragraph.",
    "Why do leaves change colour in autumn? Answer in a short paragraph.",
    "Give three tips for writing clear emails.",
    "Explain what a hash table is to a new programmer.",
    "Explain in a short paragraph why the sky is blue.",
    "Write a short story about a robot who learns to paint.",
    "Give me three tips for learning a new language.",
    "What are the health benefits of drinking green tea?",
    "Describe how a bill becomes a law in a democracy.",
    "Write a Python function that returns the n-th triangular number.",
    "What should I pack for a weekend hiking trip in the mountains?",
    "Explain the difference between weather and climate.",
]


def build_prompts(n: int, seed: int) -> list[str]:
    """A seeded, de-duplicated list of ``n`` diverse user messages (none of COURSE/EVAL_PROMPTS)."""
    rng = random.Random(seed)
    topics = [t for ts in TOPICS.values() for t in ts]
    domains = list(TOPICS.values())
    pools = {
        "topic": [tpl.format(t=t) for tpl in TEMPLATES for t in topics],
        "pair": [tpl.format(t=a, u=b) for tpl in PAIR_TEMPLATES for d in domains for a in d for b in d if a != b],
        "code": [tpl.format(c=c) for tpl in CODE_TEMPLATES for c in CODE_TASKS]
        + [tpl.format(c=c) for tpl in CODE_CONCEPT_TEMPLATES for c in CODE_CONCEPTS],
        "advice": [tpl.format(a=a) for tpl in ACTIVITY_TEMPLATES for a in ACTIVITIES]
        + [tpl.format(d=d) for tpl in DISH_TEMPLATES for d in DISHES],
        "rewrite": [tpl.format(s=s) for tpl in SENTENCE_TEMPLATES for s in SENTENCES],
        "math": [],
        "short": list(SHORT_PROMPTS),
    }
    for _ in range(400):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
        pools["math"].append(rng.choice([
            f"What is {a} + {b}?", f"What is {a} times {c}?",
            f"If I have {a} apples and give away {min(a, b) // 2} of them, how many are left?",
            f"Solve for x: {c}x + {a} = {c * b + a}.", f"What is {c * 5} percent of {a * 10}?",
            f"A train travels {a * 10} kilometers in {c} hours. What is its average speed?",
            f"Convert {a} kilometers to miles.", f"Is {a * 2 + 1} a prime number? Explain.",
        ]))
    share = {"topic": 0.58, "pair": 0.07, "code": 0.12, "advice": 0.10, "rewrite": 0.05, "math": 0.06, "short": 0.02}
    excluded = set(COURSE_PROMPTS) | set(EVAL_PROMPTS)
    out: list[str] = []
    seen: set[str] = set(excluded)
    for name, frac in share.items():
        pool = sorted(set(pools[name]) - seen)
        rng.shuffle(pool)
        take = pool[: max(1, round(frac * n))]
        out += take
        seen.update(take)
    filler = sorted(set(pools["topic"] + pools["pair"]) - seen)  # small pools ran out: top up with topics
    rng.shuffle(filler)
    out += filler[: max(0, n - len(out))]
    rng.shuffle(out)
    out = out[:n]
    assert not (set(out) & excluded)
    return out
