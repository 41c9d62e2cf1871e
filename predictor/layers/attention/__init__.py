"""The attention block of a decoder layer (`ops`) and the key tiles a sliding-window kernel computes (`tiles`)."""
