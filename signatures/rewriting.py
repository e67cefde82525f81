import dspy


class RewriteQuery(dspy.Signature):
    """Rewrite the question into a short web search query of at most three keyword phrases separated
    by semicolons, naming the entity and the attribute asked for; for example, for "Who wrote the
    screenplay of Death of a Batman?" the query is "Death of a Batman; screenwriter". Reply with the
    query only."""

    question: str = dspy.InputField()
    query: str = dspy.OutputField(desc="at most three keyword phrases separated by semicolons")


class ReviseQuery(dspy.Signature):
    """The search queries tried so far found no passage that answers the question. Write a different
    search query of at most three keyword phrases separated by semicolons: name the entity and the
    attribute asked for in other words (a synonym, the wider topic, or the document that would state
    it), and repeat none of the tried queries. Reply with the query only."""

    question: str = dspy.InputField()
    tried_queries: str = dspy.InputField(desc="the queries already searched, one per line")
    query: str = dspy.OutputField(desc="at most three keyword phrases separated by semicolons")
