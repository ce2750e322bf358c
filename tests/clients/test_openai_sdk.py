"""The real `openai` client (PyPI) against `wgllm serve`: models, chat plain and
streamed, completions, the Responses API, and errors raised as the client's own
exception types."""
import openai
import pytest
from openai import OpenAI

KEY = "sk-wgllm-test"


@pytest.fixture(scope="module")
def client(server_factory):
    s = server_factory("-np", "2", "-c", "1024", "--api-key", KEY, "-a", "smol")
    return OpenAI(api_key=KEY, base_url=s.url + "/v1", max_retries=0, timeout=300)


def greedy_chat(client, **kw):
    return client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=8, **kw)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smol"]


def test_chat_plain_and_streamed_agree(client):
    plain = greedy_chat(client)
    assert plain.object == "chat.completion"
    assert plain.choices[0].message.role == "assistant"
    assert plain.choices[0].finish_reason in ("length", "stop")
    assert plain.usage.completion_tokens <= 8
    assert plain.usage.prompt_tokens > 5
    text = plain.choices[0].message.content
    assert text
    streamed = ""
    last = None
    for chunk in greedy_chat(client, stream=True, stream_options={"include_usage": True}):
        last = chunk
        if chunk.choices and chunk.choices[0].delta.content:
            streamed += chunk.choices[0].delta.content
    assert streamed == text
    assert last.usage.completion_tokens == plain.usage.completion_tokens


def test_completions(client):
    c = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=6,
                                  temperature=0)
    assert c.object == "text_completion"
    assert c.choices[0].text
    assert c.usage.completion_tokens == 6


def test_responses(client):
    r = client.responses.create(model="smol", instructions="Answer briefly.",
                                input="What is the capital of France?", max_output_tokens=8,
                                temperature=0)
    assert r.id.startswith("resp")
    assert r.output[0].id.startswith("msg")
    assert r.output_text
    assert r.usage.output_tokens <= 8
    gathered, done = "", None
    for ev in client.responses.create(model="smol", instructions="Answer briefly.",
                                      input="What is the capital of France?",
                                      max_output_tokens=8, temperature=0, stream=True):
        if ev.type == "response.output_text.delta":
            gathered += ev.delta
        if ev.type == "response.completed":
            done = ev.response
    assert done is not None
    assert gathered == done.output_text == r.output_text


def test_errors_are_the_clients_exception_types(client, server_factory):
    bad_key = OpenAI(api_key="wrong", base_url=client.base_url, max_retries=0)
    # (/v1/models is public, as llama-server keeps it.)
    with pytest.raises(openai.AuthenticationError):
        greedy_chat(bad_key)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages="not a list", max_tokens=4)
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as e:
        # Far past a slot's 512 tokens, with context shift off by default for requests.
        client.completions.create(model="smol", prompt="hello " * 2000, max_tokens=4)
    assert "context" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.get("/no-such-endpoint", cast_to=object)
    # Still answering after all of that.
    assert greedy_chat(client).choices[0].message.content
