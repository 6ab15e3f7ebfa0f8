"""A robot file of the tests' own whose only skill is blocking: every plan waits for a value at its first call."""

LOOKER = {
    "robot": "looker", "language": "calls", "segment": {"max_tokens": 20, "generation_time": 0.1},
    "skills": [
        {"abbr": "look_for", "name": "look_for", "args": [{"object": "name"}], "returns": "text", "blocking": True,
         "description": "look for an object here; tells where it is", "time": {"fixed": 1.0}},
    ],
    "prompt": {"intro": "You control a robot that looks for things.", "guidance": "One call per line.",
               "examples": [{"task": "Find the cup.", "plan": "look_for('cup'); # on the table\nlook_for('lid');"}]},
}
