"""Prometheus metrics of a server, in its own registry: requests, latency, queue depth, samples counted, and per batch
how full it is and how many requests share it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000)
SHARING_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
FILL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


class Metrics:
    """The server's metrics; the per-model gauges read its worker when scraped."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("diffsmooth_requests", "Infer requests answered, by model and HTTP status",
                                ["model", "status"], registry=self.registry)
        self.latency = Histogram("diffsmooth_request_seconds", "Infer request latency", ["model"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue = Gauge("diffsmooth_queue_images", "Images queued or in flight", ["model"], registry=self.registry)
        self.samples = Gauge("diffsmooth_samples_counted", "Monte Carlo samples counted since start (rate(): "
                             "samples per second)", ["model"], registry=self.registry)
        self.sharing = Histogram("diffsmooth_batch_requests", "Requests whose samples share a batch", ["model"],
                                 buckets=SHARING_BUCKETS, registry=self.registry)
        self.fill = Histogram("diffsmooth_batch_fill", "Rows of a batch over the batch size", ["model"],
                              buckets=FILL_BUCKETS, registry=self.registry)

    def watch(self, name: str, worker) -> None:
        """The gauges of one model, read from its worker."""
        self.queue.labels(name).set_function(lambda: worker.waiting)
        self.samples.labels(name).set_function(lambda: worker.samples)
        sharing, fill = self.sharing.labels(name), self.fill.labels(name)

        def on_batch(requests: int, rows: int) -> None:
            sharing.observe(requests)
            fill.observe(rows / worker.batch)

        worker.on_batch = on_batch

    def observe(self, model: str, status: int, seconds: float) -> None:
        self.requests.labels(model, str(status)).inc()
        self.latency.labels(model).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)

