"""usg.bench"""
