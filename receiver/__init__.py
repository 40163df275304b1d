"""The receiving side of OTLP: HTTP and gRPC servers, decoders and the hostile-client limits."""
