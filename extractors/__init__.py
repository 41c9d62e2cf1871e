"""Turn traces and foreign sample files into operator samples; one module per source format."""
