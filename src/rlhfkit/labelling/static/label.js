// The labelling page: keyboard and mouse, the ranking of K > 2 responses, and a vote sent once.
//
// The vote's id is a UUID made when the page is shown; every retry of the submission sends the
// same id, so a vote the server stored before the connection dropped is not counted twice.
// This script never inserts markup: all text goes in through textContent.
"use strict";

(() => {
  const task = document.getElementById("task");
  if (!task) return;

  const taskId = Number(task.dataset.task);
  const k = Number(task.dataset.k);
  const voteId = newVoteId();
  const status = document.getElementById("status");
  const buttons = Array.from(task.querySelectorAll(".actions button"));
  const cards = Array.from(task.querySelectorAll(".rankable"));
  const orderText = document.getElementById("order");
  const submitButton = task.querySelector('[data-action="submit"]');
  const MAX_ATTEMPTS = 6;
  let order = []; // display slots placed so far, best first
  let sending = false;

  function newVoteId() {
    if (window.crypto.randomUUID) return window.crypto.randomUUID();
    // randomUUID exists only on https and localhost; a team server on the LAN is plain http.
    const bytes = window.crypto.getRandomValues(new Uint8Array(16));
    bytes[6] = (bytes[6] & 0x0f) | 0x40; // version 4
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
    const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }

  function say(text, problem = false) {
    status.textContent = text;
    status.classList.toggle("problem", problem);
  }

  function extras() {
    const rated = task.querySelector('input[name="rating"]:checked');
    const flag = document.getElementById("flag").value.trim();
    return { rating: rated ? Number(rated.value) : null, flag: flag || null };
  }

  function setBusy(busy) {
    sending = busy;
    for (const button of buttons) button.disabled = busy;
    if (!busy) showOrder();
  }

  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function send(choice, slots) {
    if (sending) return;
    setBusy(true);
    const body = JSON.stringify({ id: voteId, task: taskId, choice, order: slots, ...extras() });
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt += 1) {
      let response = null;
      try {
        response = await fetch("/api/votes", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          credentials: "same-origin",
          body,
        });
      } catch (error) {
        response = null; // no answer: the vote may or may not be stored; retry with its id
      }
      if (response && response.ok) {
        say("Saved.");
        window.location.assign("/");
        return;
      }
      if (response && response.status < 500) {
        const answer = await response.json().catch(() => ({}));
        if (response.status === 401) {
          window.location.assign("/login");
          return;
        }
        say(`Not saved: ${answer.error || response.statusText}`, true);
        setBusy(false);
        return;
      }
      if (attempt < MAX_ATTEMPTS) {
        say(`Not saved yet: cannot reach the server; trying again (${attempt} of ${MAX_ATTEMPTS - 1})...`, true);
        await pause(400 * 2 ** (attempt - 1));
      }
    }
    say("Not saved: cannot reach the server. Vote again to retry.", true);
    setBusy(false);
  }

  // ------------------------------------------------------------------------------ K = 2
  function choosePair(choice) {
    if (choice === "a") send("rank", [0, 1]);
    else if (choice === "b") send("rank", [1, 0]);
    else send(choice, null);
  }

  const pairKeys = {
    1: "a",
    ArrowLeft: "a",
    2: "b",
    ArrowRight: "b",
    " ": "tie",
    x: "bad",
    s: "skip",
  };

  // ------------------------------------------------------------------------------ K > 2
  function showOrder() {
    if (!cards.length) return;
    for (const card of cards) {
      const place = order.indexOf(Number(card.dataset.slot));
      card.classList.toggle("placed", place >= 0);
      card.setAttribute("aria-selected", String(place >= 0));
      card.querySelector(".place").textContent = place >= 0 ? `placed ${ordinal(place + 1)}` : "";
    }
    orderText.textContent = order.length ? order.map((slot) => slot + 1).join(" > ") : "none yet";
    submitButton.disabled = sending || order.length !== k;
  }

  function ordinal(n) {
    const suffix = { 1: "st", 2: "nd", 3: "rd" }[n % 100 > 10 && n % 100 < 14 ? 0 : n % 10];
    return `${n}${suffix || "th"}`;
  }

  function toggle(slot) {
    if (sending) return;
    order = order.includes(slot) ? order.filter((s) => s !== slot) : [...order, slot];
    showOrder();
  }

  function place(slot) {
    if (!order.includes(slot)) toggle(slot);
  }

  function undo() {
    order = order.slice(0, -1);
    showOrder();
  }

  function submitRanking() {
    if (order.length === k) send("rank", order);
  }

  function moveFocus(step) {
    const now = cards.indexOf(document.activeElement);
    const next = now < 0 ? (step > 0 ? 0 : cards.length - 1) : (now + step + cards.length) % cards.length;
    cards[next].focus();
  }

  function rankKey(key) {
    const digit = Number(key);
    if (Number.isInteger(digit) && digit >= 1 && digit <= Math.min(k, 9)) return () => place(digit - 1);
    const focused = cards.indexOf(document.activeElement);
    const actions = {
      ArrowDown: () => moveFocus(1),
      ArrowUp: () => moveFocus(-1),
      " ": () => focused >= 0 && toggle(focused),
      Backspace: undo,
      Enter: submitRanking,
      x: () => send("bad", null),
      s: () => send("skip", null),
    };
    return actions[key];
  }

  // ----------------------------------------------------------------------------- events
  for (const button of buttons) {
    button.addEventListener("click", () => {
      const { choice, action } = button.dataset;
      if (action === "submit") submitRanking();
      else if (action === "undo") undo();
      else if (k === 2) choosePair(choice);
      else send(choice, null);
    });
  }
  for (const card of cards) {
    card.addEventListener("click", () => toggle(Number(card.dataset.slot)));
  }

  // The keys a focused control uses itself, which no shortcut may take: every key in a text
  // field, the arrows and Space on a rating, Enter and Space on a button or a link. The
  // shortcuts have the rest, so a focused button never does something else than it says.
  function ownedBy(target, key) {
    if (target instanceof HTMLInputElement && target.type === "radio") {
      return key === " " || key.startsWith("Arrow");
    }
    if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement) return true;
    if (target instanceof HTMLSelectElement) return true;
    if (target instanceof HTMLButtonElement || target instanceof HTMLAnchorElement) {
      return key === "Enter" || key === " ";
    }
    return false;
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat || sending) return;
    const target = event.target;
    if (event.key === "Escape" && target instanceof HTMLInputElement) {
      target.blur(); // back to the shortcuts
      return;
    }
    if (ownedBy(target, event.key)) return;
    const action = k === 2 ? pairKeys[event.key] && (() => choosePair(pairKeys[event.key])) : rankKey(event.key);
    if (action) {
      event.preventDefault();
      action();
    }
  });

  showOrder();
})();
