from wordfreq.count import top_words, words

__all__ = ["top_words", "words"]
