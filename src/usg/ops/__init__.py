"""usg.ops"""
