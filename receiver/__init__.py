"""The receiving side of OTLP: its HTTP and gRPC servers (built on sloscope.edge), decoders, content codings, OTLP
files and client limits."""
