"""Synthetic labelled data for a domain that has only documents (``python -m optimize.synthesize``):
the rules a question must pass (:mod:`.rules`), document splits (:mod:`.splits`), LM candidates and
their negatives (:mod:`.candidates`), the review file (:mod:`.review`) and the merge into the domain's
files (:mod:`.merge`)."""
