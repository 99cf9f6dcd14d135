"""Prometheus metrics of a server, in its own registry: requests, latency, queue depth, samples counted, and how
full the batches are and how many requests share one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000)


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
        self.sharing = Gauge("diffsmooth_requests_per_batch", "Requests sharing a batch (mean of the last 1000 batches)",
                             ["model"], registry=self.registry)

    def watch(self, name: str, worker) -> None:
        """The gauges of one model, read from its worker."""
        self.queue.labels(name).set_function(lambda: worker.waiting)
        self.samples.labels(name).set_function(lambda: worker.samples)
        self.sharing.labels(name).set_function(lambda: _mean(getattr(worker.scheduler, "shared", ())))

    def observe(self, model: str, status: int, seconds: float) -> None:
        self.requests.labels(model, str(status)).inc()
        self.latency.labels(model).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
