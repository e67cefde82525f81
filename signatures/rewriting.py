import dspy


class RewriteQuery(dspy.Signature):
    """Rewrite the question into a short web search query of at most three keyword phrases separated
    by semicolons, naming the entity and the attribute asked for; for example, for "Who wrote the
    screenplay of Death of a Batman?" the query is "Death of a Batman; screenwriter". Reply with the
    query only."""

    question: str = dspy.InputField()
    query: str = dspy.OutputField(desc="at most three keyword phrases separated by semicolons")
