"""The SQL agent: a LangGraph text-to-SQL graph, as in the Agent Lightning paper.

    write_query -> execute_query -> check_query -> rewrite_query -> execute_query -> ...

``write_query`` asks the model for a query, ``execute_query`` runs it on the task's SQLite
database (read-only), ``check_query`` shows the model the query and its result (or error) and
asks whether it answers the question, ``rewrite_query`` writes a corrected query from the
checker's critique; at most two rewrites. The reward is execution accuracy: 1.0 when the final
query's result equals the gold query's (rows compared as multisets), else 0.0 (a query that
does not execute scores 0).

Nothing in it knows about training: it reads the model endpoint from ``resources.llm``. The
agentbolt-langchain adapter names each LLM call after the graph node that made it, which is how
training can pick the writer and the rewriter and leave the checker alone.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

MAX_REWRITES = 2
MAX_ROWS = 1000
"""More rows than this from a query: treated as an execution error (nothing here returns so many)."""
MAX_SQLITE_STEPS = 200_000
"""SQLite VM steps (in units of 1000) before a query is aborted: a cross join must not hang a rollout."""
CORRECT = "THE QUERY IS CORRECT"
"""What the checker is asked to say about a good query. Routing: a query that failed to execute
is always rewritten; an executed one only when the checker's reply starts with WRONG or INCORRECT
(a 135M checker that rambles does not send a good query to the rewriter)."""
PREFILL = "<sql>SELECT"
"""The writer's and rewriter's reply starts here (``continue_final_message``): the model writes the rest."""

SYSTEM = "You write SQLite queries for this database:\n{schema}"
CHECK = (
    "Question: {question}\nQuery: {query}\nResult: {result}\n"
    f"Reply {CORRECT} if the query answers the question, else reply WRONG: and the mistake."
)
REWRITE = "Question: {question}\nWrong query: {query}\nProblem: {problem}\nWrite the corrected query."

_SQL = re.compile(r"<sql>(.*?)(?:</sql>|$)", re.DOTALL | re.IGNORECASE)


class SqlState(TypedDict, total=False):
    question: str
    query: str
    result: str
    error: str | None
    verdict: str
    rewrites: int


# -- the database --------------------------------------------------------------------------------


def run_query(db_path: str, query: str) -> list[tuple[Any, ...]]:
    """Rows of ``query`` on a read-only connection; raises ``sqlite3.Error`` when it does not run."""
    uri = f"{Path(db_path).resolve().as_uri()}?mode=ro"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    steps = 0

    def budget() -> int:
        nonlocal steps
        steps += 1
        return int(steps > MAX_SQLITE_STEPS)  # non-zero aborts the statement

    con.set_progress_handler(budget, 1000)
    try:
        rows = con.execute(query).fetchmany(MAX_ROWS + 1)
    finally:
        con.close()
    if len(rows) > MAX_ROWS:
        raise sqlite3.OperationalError(f"more than {MAX_ROWS} rows")
    return rows


def _normal(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def same_result(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Result sets equal as multisets of rows (floats to 6 decimals, so 2 == 2.0)."""
    return Counter(map(_normal, a)) == Counter(map(_normal, b))


def execution_accuracy(db_path: str, predicted: str | None, gold: str) -> float:
    """1.0 when ``predicted`` returns the same rows as ``gold`` (multisets), else 0.0."""
    if not predicted:
        return 0.0
    try:
        got = run_query(db_path, predicted)
    except (sqlite3.Error, sqlite3.Warning, ValueError):
        return 0.0
    return 1.0 if same_result(got, run_query(db_path, gold)) else 0.0


def extract_sql(prefill: str, reply: str) -> str:
    """The query in ``<sql>...</sql>`` of ``prefill + reply`` (a missing closing tag is tolerated)."""
    match = _SQL.search(prefill + reply)
    return " ".join((match.group(1) if match else reply).split()).rstrip(";").strip()


# -- the prompts ---------------------------------------------------------------------------------


def few_shot(task: dict[str, Any]) -> list[BaseMessage]:
    """The schema and the worked examples built from it (``task["examples"]``, see ``data.schema_examples``)."""
    messages: list[BaseMessage] = [SystemMessage(SYSTEM.format(schema=task["schema"]))]
    for example in task.get("examples") or ():
        messages += [HumanMessage(example["question"]), AIMessage(f"<sql>{example['query']}</sql>")]
    return messages


# -- the graph -----------------------------------------------------------------------------------


def build_graph(llm: ChatOpenAI, task: dict[str, Any]) -> Any:
    """The write -> execute -> check -> rewrite graph for one task (its database and schema)."""
    shots = few_shot(task)
    writer = llm.bind(
        stop=["</sql>", ";", "\n"], extra_body={"continue_final_message": True, "add_generation_prompt": False}
    )
    checker = llm.bind(stop=["\n", "."])

    async def write_query(state: SqlState) -> SqlState:
        reply = await writer.ainvoke([*shots, HumanMessage(state["question"]), AIMessage(PREFILL)])
        return {"query": extract_sql(PREFILL, str(reply.content)), "rewrites": 0}

    async def execute_query(state: SqlState) -> SqlState:
        try:
            rows = run_query(task["db_path"], state["query"])
        except (sqlite3.Error, sqlite3.Warning, ValueError) as exc:
            return {"result": f"error: {exc}", "error": str(exc)}
        return {"result": repr(rows[:5]) + (" ..." if len(rows) > 5 else ""), "error": None}

    async def check_query(state: SqlState) -> SqlState:
        prompt = CHECK.format(question=state["question"], query=state["query"], result=state["result"])
        reply = await checker.ainvoke([shots[0], HumanMessage(prompt)])
        return {"verdict": str(reply.content).strip()}

    async def rewrite_query(state: SqlState) -> SqlState:
        problem = state["error"] or state["verdict"] or "wrong result"
        prompt = REWRITE.format(question=state["question"], query=state["query"], problem=problem)
        reply = await writer.ainvoke([*shots, HumanMessage(prompt), AIMessage(PREFILL)])
        return {"query": extract_sql(PREFILL, str(reply.content)), "rewrites": state["rewrites"] + 1}

    def after_execute(state: SqlState) -> str:
        return END if state["rewrites"] >= MAX_REWRITES else "check_query"

    def after_check(state: SqlState) -> str:
        flagged = state["verdict"].upper().startswith(("WRONG", "INCORRECT"))
        return "rewrite_query" if state["error"] is not None or flagged else END

    graph = StateGraph(SqlState)
    graph.add_node("write_query", write_query)
    graph.add_node("execute_query", execute_query)
    graph.add_node("check_query", check_query)
    graph.add_node("rewrite_query", rewrite_query)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "execute_query")
    graph.add_conditional_edges("execute_query", after_execute, ["check_query", END])
    graph.add_conditional_edges("check_query", after_check, ["rewrite_query", END])
    graph.add_edge("rewrite_query", "execute_query")
    return graph.compile(name="sql_agent")


async def sql_agent(task: dict[str, Any], resources: Any) -> float:
    """Answer ``task["question"]`` on ``task["db_path"]``; the reward is execution accuracy."""
    assert resources.llm is not None, "publish an llm endpoint in the resources"
    llm = ChatOpenAI(
        base_url=resources.llm.base_url,
        api_key=resources.llm.api_key or "none",
        model=resources.llm.model,
        max_retries=0,
    )
    state = await build_graph(llm, task).ainvoke({"question": task["question"]})
    return execution_accuracy(task["db_path"], state.get("query"), task["query"])
