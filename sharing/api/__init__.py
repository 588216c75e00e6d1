"""Wire types: the API objects, annotations, labels and records every component reads and writes."""
