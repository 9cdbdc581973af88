"""The collectives primer (notebook 00): the five collectives on real ranks and their bytes."""
