"""OTLP: the protobuf encoding of span records and rows, and the single-attempt gRPC/HTTP
transport.
"""
