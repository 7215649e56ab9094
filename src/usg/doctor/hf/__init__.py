"""Checks on Hugging Face model folders: vision-language coupling between config, processor
and tokenizer (:mod:`.coupling`) and the vision token arithmetic it uses (:mod:`.vision`)."""
