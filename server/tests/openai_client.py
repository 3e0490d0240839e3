"""The official `openai` Python client against a running `rocmforge serve`: chat, streaming,
logprobs, completions, embeddings, structured output, tool calls and error classes.

Usage: python3 openai_client.py BASE_URL API_KEY MODEL_ID
Exits non-zero (with the failing check's traceback) when the server does not behave as the
OpenAI API does for the client.
"""

import json
import sys

import openai


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)

    ids = [m.id for m in client.models.list()]
    assert ids == [model], ids

    msgs = [{"role": "user", "content": "Say hello."}]
    whole = client.chat.completions.create(
        model=model, messages=msgs, temperature=0, max_tokens=12
    )
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    assert whole.usage.prompt_tokens > 0
    assert whole.usage.completion_tokens <= 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    pieces = []
    finish = None
    usage = None
    for chunk in client.chat.completions.create(
        model=model,
        messages=msgs,
        temperature=0,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(pieces) == choice.message.content, (pieces, choice.message.content)
    assert finish == choice.finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

    lp = client.chat.completions.create(
        model=model, messages=msgs, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2
    )
    entries = lp.choices[0].logprobs.content
    assert len(entries) == lp.usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)

    comp = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=0, seed=3
    )
    assert comp.choices[0].finish_reason in ("stop", "length")
    echo = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=0, echo=True
    )
    assert echo.choices[0].text == "Once upon a time" + comp.choices[0].text

    # The client asks for base64 unless told otherwise; both encodings must agree.
    emb = client.embeddings.create(model=model, input=["Once upon a time", "Once upon a time"])
    assert [d.index for d in emb.data] == [0, 1]
    a, b = emb.data[0].embedding, emb.data[1].embedding
    assert a == b and abs(sum(x * x for x in a) - 1.0) < 1e-3, sum(x * x for x in a)
    floats = client.embeddings.create(
        model=model, input="Once upon a time", encoding_format="float"
    )
    assert floats.data[0].embedding == a
    assert emb.usage.prompt_tokens == 2 * floats.usage.prompt_tokens > 0

    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    structured = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Water is wet: JSON?"}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert structured.choices[0].finish_reason == "stop", structured
    obj = json.loads(structured.choices[0].message.content)
    assert set(obj) == {"answer", "sure"} and obj["answer"] in ("yes", "no"), obj
    assert isinstance(obj["sure"], bool), obj

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.chat.completions.create(
        model=model,
        messages=ask,
        tools=[weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls", called
    (tc,) = choice.message.tool_calls
    assert tc.type == "function" and tc.id and tc.function.name == "get_weather", tc
    assert json.loads(tc.function.arguments)["city"] in ("Paris", "Oslo"), tc
    # The call and its result go back through the template; the model answers or calls again.
    ask += [choice.message, {"role": "tool", "tool_call_id": tc.id, "content": "22 C, sunny"}]
    after = client.chat.completions.create(
        model=model, messages=ask, tools=[weather], max_tokens=8, temperature=0
    )
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls"), after
    streamed_args = ""
    for chunk in client.chat.completions.create(
        model=model,
        messages=ask[:1],
        tools=[weather],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        stream=True,
    ):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                streamed_args += d.function.arguments or ""
    assert streamed_args == tc.function.arguments, (streamed_args, tc.function.arguments)

    try:
        client.chat.completions.create(model=model, messages=msgs, max_tokens=-5)
        raise AssertionError("negative max_tokens was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400

    try:
        client.chat.completions.create(model="no-such-model", messages=msgs, max_tokens=2)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404

    wrong = openai.OpenAI(base_url=base + "/v1", api_key="wrong-key", max_retries=0)
    try:
        wrong.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401

    print("openai client: all checks passed")


if __name__ == "__main__":
    main()
